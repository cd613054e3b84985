// CPU loops compiled with -mavx2 -mfma (set in kernels/CMakeLists.txt): see cpu_loops_impl.h.
#define MEMSLIM_CPU_NS avx2
#include "cpu_loops_impl.h"
#include "region_vm_impl.h"
#include "softmax_rows_impl.h"
