"""memslim-opt over torch.export archives: `memslim-opt m.pt2 -o m_opt.pt2 [--remarks] ...`.

What: memslim-opt hands a `.pt2` input to this module (`python -m memslim.opt_pt2 ARGS`):
torch.export.load, memslim.fx.optimize (the C++ decision core, as for TorchScript
input), torch.export.save. The program it writes loads with torch.export.load once memslim
is imported (its memslim ops are registered then), and its `.module()` trains.
Flags: as memslim-opt's where they apply to FX: -o OUT, --passes=a,b, --remarks, the policy
flags (from the one policy table). Errors: one `memslim-opt: error: ...` line, exit code 1,
no output file (written to a temporary name and renamed).
"""

from __future__ import annotations

import os
import sys
import tempfile


def _fail(msg: str) -> "NoReturn":  # noqa: F821
    sys.stderr.write(f"memslim-opt: error: {msg}\n")
    sys.exit(1)


def main(argv) -> int:
    inp, out, passes, remarks, policy = None, None, None, False, {}
    try:
        import memslim
        from memslim import _C
    except Exception as e:  # noqa: BLE001
        _fail(f"cannot import memslim: {e}")
    options = {"--" + name.replace("_", "-"): name for name, _, _ in _C.policy_options()}
    it = iter(argv)
    for a in it:
        if a == "-o":
            out = next(it, None)
            if out is None:
                _fail("-o needs a file name")
        elif a.startswith("--passes="):
            passes = [p for p in a.split("=", 1)[1].split(",") if p]
        elif a.startswith("--pipeline="):
            _fail(
                "--pipeline is for TorchScript input; .pt2 takes --passes "
                "(default: output-saving-activations)"
            )
        elif a == "--remarks":
            remarks = True
        elif a.split("=", 1)[0] in options:
            if "=" not in a:
                _fail(f"{a} needs a value ({a}=VALUE)")
            flag, text = a.split("=", 1)
            policy[options[flag]] = _C.parse_policy_value(text)  # as memslim-opt reads flags
        elif a.startswith("-") and a != "-":
            _fail(f"unknown or unsupported option for .pt2 input: {a}")
        elif inp is None:
            inp = a
        else:
            _fail(f"more than one input: {inp}, {a}")
    if inp is None:
        _fail("no input")
    if not os.path.isfile(inp):
        _fail(f"cannot read {inp}: no such file")
    import torch

    try:
        ep = torch.export.load(inp)
    except Exception as e:  # noqa: BLE001
        _fail(
            f"cannot read {inp} as a torch.export archive: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        )
    try:
        memslim.fx.optimize(ep, passes=passes, **policy)
    except (ValueError, TypeError) as e:
        _fail(str(e).replace("memslim.fx.optimize: ", "").replace("memslim.optimize: ", ""))
    if remarks:
        for d in memslim.report(ep):
            sys.stderr.write(str(d) + "\n")
    if out is None:
        sys.stdout.write(str(ep.graph_module.graph) + "\n")
        return 0
    fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=os.path.dirname(os.path.abspath(out)))
    os.close(fd)
    try:
        torch.export.save(ep, tmp)
        os.replace(tmp, out)
    except Exception as e:  # noqa: BLE001
        os.unlink(tmp)
        _fail(f"cannot write {out}: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
