/* A seed for fuzz_python_binary: the symbols gpuscope reads in a CPython 3.13 interpreter, in a
 * small shared object (bench/fuzz.sh builds it): Py_Version, _PyEval_EvalFrameDefault, and
 * _PyRuntime beginning with _Py_DebugOffsets (cookie, version, then offsets; the words gpuscope
 * reads carry 3.13.0's values). */
typedef unsigned long long u64;

const unsigned int Py_Version = 0x030d00f0;

u64 _PyRuntime[128] = {
    [0] = 0x7970677562656478ull, /* "xdebugpy" */
    [1] = 0x030d00f0,
    [5] = 632,   /* runtime: interpreters.head */
    [9] = 7264,  /* interpreter: threads.head */
    [21] = 8,    /* thread state: next */
    [23] = 72,   /* current_frame */
    [25] = 160,  /* native_thread_id */
    [29] = 8,    /* frame: previous */
    [30] = 0,    /* f_executable */
    [31] = 56,   /* instr_ptr */
    [33] = 74,   /* owner */
    [35] = 112,  /* code: co_filename */
    [37] = 128,  /* co_qualname */
    [38] = 136,  /* co_linetable */
    [39] = 68,   /* co_firstlineno */
    [43] = 200,  /* co_code_adaptive */
    [66] = 32,   /* bytes: ob_sval */
    [70] = 40,   /* unicode: ASCII data */
};

void _PyEval_EvalFrameDefault(void) {}
