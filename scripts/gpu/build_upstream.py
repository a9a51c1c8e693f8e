#!/usr/bin/env python3
"""Builds NVIDIA/cuda-samples' Samples/0-6 with plain nvcc, for the GPU of the
machine it runs on (sm_90 unless ARCH says otherwise), every program at once
on all cores: what each sample's CMakeLists.txt says (add_executable's
files, the libraries it links, separable compilation, the fatbin or PTX a
driver-API sample loads at run time) is read from it, without CMake.

usage: build_upstream.py SRC OUT
  SRC  the unpacked samples (Samples/ and Common/ side by side)
  OUT  gets bin/NAME -> the sample's folder, holding the program NAME
       (programs run from their own folder, where their data is)

Prints one line per sample (built, or why not) and a last line
`built=N failed=M`. Samples that need what the machine lacks (OpenGL,
Vulkan, EGL, MPI, NvSci, a second GPU's toolchain) fail to build and are
counted, not hidden.
"""
import concurrent.futures as cf
import glob
import os
import re
import subprocess
import sys

ARCH = os.environ.get("ARCH", "90")
LIBS = {
    "cublas": "cublas", "cublasLt": "cublasLt", "cufft": "cufft", "curand": "curand",
    "cusparse": "cusparse", "cusolver": "cusolver", "nvrtc": "nvrtc",
    "nvJitLink": "nvJitLink", "cudadevrt": "cudadevrt", "nvml": "nvidia-ml",
    "nppc": "nppc", "nppial": "nppial", "nppicc": "nppicc", "nppidei": "nppidei",
    "nppif": "nppif", "nppig": "nppig", "nppim": "nppim", "nppist": "nppist",
    "nppisu": "nppisu", "nppitc": "nppitc", "npps": "npps", "cuda_driver": "cuda",
    "nvjpeg": "nvjpeg",
}
# Libraries a library needs beside it on the link line.
NEEDS = {"cusolver": ["cusparse", "cublas", "cublasLt"]}


def cmake_text(path):
    """The CMakeLists without comments, with ${CMAKE_CURRENT_SOURCE_DIR}."""
    text = open(path, errors="replace").read()
    text = re.sub(r"#[^\n]*", "", text)
    return text.replace("${CMAKE_CURRENT_SOURCE_DIR}/", "").replace(
        "${CMAKE_CURRENT_BINARY_DIR}/", "")


def plan(d):
    """What to build in sample folder `d`: [(target, files, libs, rdc)], and
    the runtime images [(source, output, kind)]."""
    text = cmake_text(os.path.join(d, "CMakeLists.txt"))
    images = []
    for kind in ("FATBIN", "PTX", "CUBIN"):
        out = re.search(r'set\(CUDA_%s_FILE\s+"?([^")\s]+)' % kind, text)
        src = re.search(r'set\(CUDA_KERNEL_SOURCE\s+"?([^")\s]+)', text)
        if out and src:
            images.append((src.group(1), os.path.basename(out.group(1)), kind.lower()))
    targets = []
    for m in re.finditer(r"add_executable\(\s*([\w.-]+)\s+([^)]*)\)", text):
        name, files = m.group(1), m.group(2).split()
        files = [f for f in files if re.search(r"\.(cu|cpp|cc|c)$", f)]
        tail = text[m.end():]
        libs = set()
        for lm in re.finditer(r"target_link_libraries\(\s*%s\b([^)]*)\)" % re.escape(name), text):
            for lib in re.findall(r"CUDA::(\w+)", lm.group(1)):
                libs.add(lib.replace("_static", ""))
        rdc = bool(re.search(r"CUDA_SEPARABLE_COMPILATION\s+ON", tail))
        for lib in list(libs):
            libs.update(NEEDS.get(lib, []))
        incs = []
        for im in re.finditer(r"target_include_directories\(\s*%s\b([^)]*)\)" % re.escape(name), text):
            incs += [i for i in im.group(1).split() if i not in ("PRIVATE", "PUBLIC") and "$" not in i]
        extra = ["-I" + i for i in incs]
        if "find_package(OpenMP" in text:
            extra += ["-Xcompiler", "-fopenmp", "-lgomp"]
        targets.append((name, files, sorted(libs), rdc, extra))
    return targets, images


def lib_dirs():
    dirs = [d for d in os.environ.get("LIBDIRS", "").split(":") if d]
    for root in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                 "/usr/local/nvidia/lib64"):
        if os.path.isdir(root):
            dirs.append(root)
    # NVIDIA's pip wheels (as torch has them): nvidia/*/lib
    for site in glob.glob("/usr/local/lib/python3*/dist-packages/nvidia/*/lib") + glob.glob(
            "/usr/lib/python3*/dist-packages/nvidia/*/lib"):
        dirs.append(site)
    return dirs


def link_flags(libs, dirs):
    flags = []
    for lib in libs:
        so = LIBS.get(lib)
        if so is None:
            continue
        found = None
        for d in dirs:
            cands = sorted(glob.glob(os.path.join(d, "lib%s.so*" % so)), key=len)
            stat = os.path.join(d, "lib%s.a" % so)
            if cands:
                found = ["-L" + d, "-l:" + os.path.basename(cands[0])]
                break
            if os.path.exists(stat):
                found = ["-L" + d, "-l" + so]
                break
        flags += found or ["-l" + so]
    return flags


def build(d, common, dirs):
    name = os.path.basename(d.rstrip("/"))
    if not os.path.exists(os.path.join(d, "CMakeLists.txt")):
        return name, None, "no CMakeLists.txt"
    try:
        targets, images = plan(d)
    except Exception as e:  # a CMakeLists this reader does not follow
        return name, None, "unreadable CMakeLists: %s" % e
    if not targets:
        return name, None, "no add_executable"
    base = ["nvcc", "-O2", "-std=c++17", "-arch=sm_%s" % ARCH, "-I" + common, "-I.",
            "--extended-lambda", "-Wno-deprecated-gpu-targets", "-lineinfo"]
    for src, out, kind in images:
        r = subprocess.run(base + ["-" + kind, "-o", out, src], cwd=d,
                           capture_output=True, text=True)
        if r.returncode:
            return name, None, "image %s: %s" % (out, r.stderr.strip().splitlines()[-1:])
    made = []
    for target, files, libs, rdc, extra in targets:
        if not files:
            continue
        cmd = base + extra + (["-rdc=true"] if rdc else []) + files + ["-o", target]
        need = set(libs) | {"cuda_driver"} | ({"cudadevrt"} if rdc else set())
        cmd += link_flags(sorted(need), dirs) + ["-lpthread", "-ldl"]
        r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
        if r.returncode:
            err = [l for l in r.stderr.splitlines() if "error" in l.lower()][:1]
            return name, None, "build: %s" % (err or r.stderr.strip().splitlines()[-1:])
        made.append(target)
    return name, made, "ok"


def main():
    src, out = sys.argv[1], sys.argv[2]
    common = os.path.abspath(os.path.join(src, "Common"))
    dirs = lib_dirs()
    samples = sorted(glob.glob(os.path.join(src, "Samples", "[0-6]_*", "*", "")))
    os.makedirs(os.path.join(out, "bin"), exist_ok=True)
    built = failed = 0
    with cf.ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        for name, made, why in pool.map(lambda d: build(d, common, dirs), samples):
            if made and name in made:
                built += 1
                d = [s for s in samples if os.path.basename(s.rstrip("/")) == name][0]
                link = os.path.join(out, "bin", name)
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(os.path.abspath(d), link)
                print("%-34s built" % name)
            else:
                failed += 1
                print("%-34s not built: %s" % (name, why if made is None else "no program " + name))
    print("built=%d failed=%d" % (built, failed))


if __name__ == "__main__":
    main()
