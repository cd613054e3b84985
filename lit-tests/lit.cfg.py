# lit configuration for memslim's pass tests: every .ir file is TorchScript IR
# whose `# RUN:` lines run memslim-opt and check the result with FileCheck (the
# IR parser skips `#` lines, so a test file is also a valid input).
import os

import lit.formats

config = config  # noqa: F821  (lit defines `config` before it runs this file)
config.name = "memslim"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".ir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.memslim_build_dir, "lit-tests")
config.substitutions.append(("%memslim-opt", os.path.join(config.memslim_bin_dir, "memslim-opt")))
config.environment["PATH"] = os.pathsep.join(
    [config.llvm_tools_dir, config.environment.get("PATH", "")]
)
