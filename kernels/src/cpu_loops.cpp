// CPU loops for baseline x86-64 (or any other target): see cpu_loops_impl.h.
#define MEMSLIM_CPU_NS baseline
#include "cpu_loops_impl.h"
#include "region_vm_impl.h"
#include "softmax_rows_impl.h"
