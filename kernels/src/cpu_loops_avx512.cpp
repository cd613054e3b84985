// CPU loops compiled with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma (set in
// kernels/CMakeLists.txt): see cpu_loops_impl.h. aten picks its AVX-512 kernels
// on such processors too, so the side-by-side timings compare like with like.
#define MEMSLIM_CPU_NS avx512
#include "cpu_loops_impl.h"
#include "region_vm_impl.h"
#include "softmax_rows_impl.h"
