# memslim_core's include rule, checked before it compiles (passes/CMakeLists.txt): the decision
# core reads graphs through GraphView only, so no file of it may include torch::jit
# (torch/csrc/...), torch's umbrella headers, a front end's headers (memslim/jit, memslim/fx)
# or the runtime's (memslim/<name>.h, runtime/include). Allowed: memslim/core/, memslim/kernels/
# (the torch-free tables), c10 / ATen core headers and the standard library.
set(bad "")
string(REPLACE "|" ";" FILES "${FILES}")
foreach(f IN LISTS FILES)
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS lines)
    if(line MATCHES "[<\"](torch/|memslim/(jit|fx)/|memslim/[a-z_]+\\.h)")
      string(APPEND bad "\n  ${f}: ${line}")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "memslim_core includes what it must not (torch::jit, a front end, the runtime):${bad}")
endif()
file(WRITE "${STAMP}" "ok\n")
