#!/usr/bin/env python3
"""Compile dumped kernel sources (ferrodnn compile-cases --dump DIR) with NVRTC and print ptxas's
register and spill report for each: `python3 scripts/ptxas_info.py DIR [sm_90a]`.
Needs libnvrtc (LD_LIBRARY_PATH) and the CUDA headers (FERRODNN_CUDA_INCLUDE)."""
import ctypes, os, sys, glob

def main():
    d = sys.argv[1]
    arch = sys.argv[2] if len(sys.argv) > 2 else "sm_90a"
    lib = ctypes.CDLL("libnvrtc.so" if os.path.exists("libnvrtc.so") else next(
        p for dd in os.environ.get("LD_LIBRARY_PATH", "").split(":") if dd for p in glob.glob(os.path.join(dd, "libnvrtc.so*"))))
    inc = os.environ.get("FERRODNN_CUDA_INCLUDE", "/usr/local/cuda/include")
    for path in sorted(glob.glob(os.path.join(d, "*.cu"))):
        src = open(path, "rb").read()
        prog = ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(path).encode(), 0, None, None) == 0
        opts = [f"--gpu-architecture={arch}", "-std=c++17", "-default-device", f"-I{inc}", "--ptxas-options=-v"]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        r = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        keep = [l.strip() for l in log.splitlines() if any(k in l for k in ("registers", "spill", "error", "warning", "bytes stack", "Performance Loss"))]
        print(f"== {os.path.basename(path)} rc={r}")
        for l in keep:
            print("   ", l)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))

main()
