/* A thread of its own that makes a CUDA call before it has ever run Python, then calls back into
 * Python (ctypes gives the thread a Python thread state then), where the callback makes another:
 * the second call's stack must show the callback's Python frame. Driven by
 * tests/targets/py_late_thread.py. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

typedef int (*Malloc)(void **, size_t);

struct job {
	Malloc cuda_malloc;
	void (*callback)(void);
};

static void *run(void *arg)
{
	struct job *j = arg;
	void *p = NULL;
	j->cuda_malloc(&p, 1 << 20); /* no Python thread state yet: fails without a GPU, recorded */
	j->callback();
	return NULL;
}

/* Returns 0, or -1 if libcudart cannot be loaded or the thread not started. */
int run_thread(const char *libcudart, void (*callback)(void))
{
	void *h = dlopen(libcudart, RTLD_NOW);
	if (!h)
		return -1;
	struct job j = {(Malloc)dlsym(h, "cudaMalloc"), callback};
	pthread_t t;
	if (!j.cuda_malloc || pthread_create(&t, NULL, run, &j))
		return -1;
	pthread_join(t, NULL);
	return 0;
}
