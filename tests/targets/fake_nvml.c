/* A stand-in for libnvidia-ml.so.1 where there is no NVIDIA driver (CI): two GPUs with fixed
 * readings, one missing the PCIe and ECC counters, the recorder's first child using GPU 0, and
 * one XID event. gpuscope's NVML path is checked against the real library on the GPU machine
 * (bench/gpu/nvml_check.py); this one tests what happens to the readings after NVML. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
enum { OK = 0, NOT_SUPPORTED = 3, INVALID = 2, INSUFFICIENT = 7, TIMEOUT = 10 };
static int devices[2];
static int xid_sent;

static int index_of(nvmlDevice_t d) { return (int *)d - devices; }

/* FAKE_NVML_CONTROL=DIR: a test steers the fake through files in DIR. DIR/pid: the process on
 * GPU 0 (otherwise the recorder's command, below); DIR/xid: an XID on GPU 0, sent once when the
 * file appears (otherwise one XID 79 at the start). */
static int read_control(const char *name, unsigned int *value)
{
	const char *dir = getenv("FAKE_NVML_CONTROL");
	if (!dir) return 0;
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	if (!f) return 0;
	int ok = fscanf(f, "%u", value) == 1;
	fclose(f);
	return ok;
}

/* The pid of the calling process's first child that is not gpuscope's stop guardian: the
 * recorded command. */
static unsigned int first_child(void)
{
	unsigned int controlled;
	if (read_control("pid", &controlled)) return controlled;
	char path[64], buf[512] = {0};
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", getpid(), getpid());
	FILE *f = fopen(path, "r");
	if (!f) return 0;
	if (!fgets(buf, sizeof(buf), f)) buf[0] = 0;
	fclose(f);
	unsigned int pid = 0;
	int used = 0;
	for (char *p = buf; sscanf(p, "%u%n", &pid, &used) == 1; p += used) {
		char comm_path[64], comm[32] = {0};
		snprintf(comm_path, sizeof(comm_path), "/proc/%u/comm", pid);
		FILE *c = fopen(comm_path, "r");
		if (c) {
			if (!fgets(comm, sizeof(comm), c)) comm[0] = 0;
			fclose(c);
		}
		if (strncmp(comm, "gs-guardian", 11) != 0) return pid;
	}
	return 0;
}

nvmlReturn_t nvmlInit_v2(void) { return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == NOT_SUPPORTED ? "Not Supported" : "Fake error"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "fake-1.0"); return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
	if (i > 1) return INVALID;
	*d = &devices[i];
	return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n) { snprintf(s, n, "Fake GPU %d", index_of(d)); return OK; }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int n) { snprintf(s, n, "GPU-fake-%d", index_of(d)); return OK; }
typedef struct { unsigned int gpu, memory; } util_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, util_t *u) { u->gpu = 40 + 10 * index_of(d); u->memory = 20; return OK; }
typedef struct { unsigned long long total, free, used; } mem_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, mem_t *m)
{
	m->total = 80ull << 30;
	m->used = (1ull << 30) * (index_of(d) + 1);
	m->free = m->total - m->used;
	return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) { *mw = 150000 + 50000 * index_of(d); return OK; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) { (void)d; *mw = 700000; return OK; }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) { (void)d; (void)sensor; *t = 55; return OK; }
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) { (void)d; *mhz = type == 1 ? 1980 : 2619; return OK; }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) { *r = index_of(d) ? 0x4 : 0x1; return OK; }
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs)
{
	if (index_of(d) == 1) return NOT_SUPPORTED;
	*kbs = counter == 0 ? 1000 : 3000;
	return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int t, int c, unsigned long long *n) { (void)d; (void)t; (void)c; (void)n; return NOT_SUPPORTED; }
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } putil_t;
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, putil_t *s, unsigned int *n, unsigned long long last)
{
	(void)last;
	unsigned int pid = first_child();
	if (index_of(d) != 0 || !pid) { *n = 0; return OK; }
	if (*n < 1) { *n = 1; return INSUFFICIENT; }
	memset(s, 0, sizeof(*s));
	s->pid = pid;
	s->timeStamp = 1;
	s->smUtil = 35;
	s->memUtil = 10;
	*n = 1;
	return OK;
}
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gi, ci; } pinfo_t;
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, pinfo_t *p)
{
	unsigned int pid = first_child();
	if (index_of(d) != 0 || !pid) { *n = 0; return OK; }
	if (*n < 1) { *n = 1; return INSUFFICIENT; }
	p->pid = pid;
	p->usedGpuMemory = 512ull << 20;
	*n = 1;
	return OK;
}
typedef struct { nvmlDevice_t device; unsigned long long type, data; unsigned int gi, ci; } event_t;
static int event_set;
nvmlReturn_t nvmlEventSetCreate(void **set) { *set = &event_set; return OK; }
nvmlReturn_t nvmlEventSetFree(void *set) { (void)set; return OK; }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, void *set) { (void)d; (void)types; (void)set; return OK; }
nvmlReturn_t nvmlEventSetWait_v2(void *set, event_t *e, unsigned int ms)
{
	(void)set;
	(void)ms;
	unsigned int xid = 79;
	if (xid_sent || (getenv("FAKE_NVML_CONTROL") && !read_control("xid", &xid))) {
		if (getenv("FAKE_NVML_CONTROL")) usleep(ms * 1000);  /* waits, as the real one does */
		return TIMEOUT;
	}
	xid_sent = 1;
	e->device = &devices[0];
	e->type = 0x8;
	e->data = xid;
	return OK;
}

/* GPM on GPU 0 only: SMs active 30%, occupancy 15%, tensor cores 5%, DRAM bandwidth 25%. */
typedef struct { unsigned int version, isSupportedDevice; } gpm_support_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; char *names[3]; } gpm_metric_t;
typedef struct { unsigned int version, numMetrics; void *sample1, *sample2; gpm_metric_t metrics[]; } gpm_get_t;
static int gpm_samples[2], gpm_taken[2];
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, gpm_support_t *s)
{
	if (s->version != 1) return INVALID;
	s->isSupportedDevice = index_of(d) == 0;
	return OK;
}
nvmlReturn_t nvmlGpmSampleAlloc(void **s)
{
	static int next;
	if (next > 1) return INVALID;
	*s = &gpm_samples[next++];
	return OK;
}
nvmlReturn_t nvmlGpmSampleFree(void *s) { (void)s; return OK; }
nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, void *s)
{
	if (index_of(d) != 0) return NOT_SUPPORTED;
	gpm_taken[(int *)s - gpm_samples] = 1;
	return OK;
}
nvmlReturn_t nvmlGpmMetricsGet(gpm_get_t *g)
{
	if (g->version != 1 || g->sample1 == g->sample2 || !gpm_taken[(int *)g->sample1 - gpm_samples] ||
	    !gpm_taken[(int *)g->sample2 - gpm_samples])
		return INVALID;
	for (unsigned int i = 0; i < g->numMetrics; ++i) {
		const unsigned int id = g->metrics[i].metricId;
		g->metrics[i].nvmlReturn = OK;
		g->metrics[i].value = id == 2 ? 30 : id == 3 ? 15 : id == 5 ? 5 : id == 10 ? 25 : -1;
		if (g->metrics[i].value < 0) g->metrics[i].nvmlReturn = NOT_SUPPORTED;
	}
	return OK;
}
