"""The C kernel checker (cpu backend): what a kernel source may include and call.

`#include` only of standard math/OpenMP/stdlib/SIMD headers; no calls to
system/exec*/fork/popen/fopen/dlopen/syscall/socket/getenv and kin; no inline asm, no
constructor/destructor/ifunc attributes, no token pasting (`##`) or computed includes that would
hide a forbidden name. A source-level check: it names the line to fix. (What the compiled
object may link and contain is the backend's check of the object itself.)
"""

from __future__ import annotations

import re

from tuner.codecheck.findings import Finding

ALLOWED_HEADERS = {"math.h", "stdint.h", "stddef.h", "stdlib.h", "stdbool.h", "float.h", "limits.h",
                   "string.h", "omp.h", "complex.h", "tgmath.h", "stdalign.h", "assert.h",
                   "immintrin.h", "x86intrin.h", "xmmintrin.h", "emmintrin.h", "pmmintrin.h",
                   "smmintrin.h", "nmmintrin.h", "arm_neon.h", "arm_sve.h", "riscv_vector.h"}
FORBIDDEN_C = {"system", "popen", "pclose", "fork", "vfork", "clone", "execl", "execle", "execlp",
               "execv", "execve", "execvp", "execvpe", "fexecve", "posix_spawn", "posix_spawnp",
               "fopen", "freopen", "fdopen", "open", "openat", "creat", "read", "write", "pread",
               "pwrite", "unlink", "remove", "rename", "mkdir", "rmdir", "chmod", "chown",
               "dlopen", "dlsym", "syscall", "socket", "connect", "bind", "listen", "accept",
               "send", "recv", "sendto", "recvfrom", "getenv", "setenv", "putenv", "kill", "raise",
               "signal", "sigaction", "ptrace", "mmap", "mprotect", "munmap", "exit", "_exit",
               "abort", "atexit", "asm", "__asm__", "__asm", "setjmp", "longjmp", "printf",
               "fprintf", "puts", "fputs", "scanf", "sleep", "usleep", "nanosleep", "time",
               "clock", "clock_gettime", "gettimeofday", "rand", "srand"}
_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_C_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
_ASM = re.compile(r"\b(asm|__asm__|__asm)\b")


def check_c(source: str) -> list[Finding]:
    original = source.splitlines()
    # Comments out (newlines kept), then backslash-continued lines joined: a name split by
    # backslash-newline is still that name. Each logical line remembers its first line.
    stripped = _C_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), source)
    lines, starts, line_no = [], [], 1
    for chunk in re.split(r"(?<!\\)\n", stripped):
        lines.append(chunk.replace("\\\n", ""))
        starts.append(line_no)
        line_no += chunk.count("\n") + 1
    out: list[Finding] = []

    def bad(i: int, why: str) -> None:
        n = starts[i]
        out.append(Finding(n, original[n - 1] if 0 < n <= len(original) else "", why))

    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith("#"):
            directive = s[1:].strip()
            if directive.startswith("include"):
                m = re.match(r'include\s*[<"]([^>"]+)[>"]', directive)
                if not m:
                    bad(i, "computed #include: name the header literally")
                elif m.group(1) not in ALLOWED_HEADERS:
                    bad(i, f"#include <{m.group(1)}>: only standard math/OpenMP/stdlib/SIMD headers "
                           f"may be included ({', '.join(sorted(ALLOWED_HEADERS))})")
            elif directive.startswith(("define", "undef")) and "##" in directive:
                bad(i, "token pasting (##) in a macro")
            elif re.match(r"pragma\s+(GCC\s+)?dependency\b", directive):
                bad(i, "#pragma dependency reads another file; a kernel reads no files")
            elif directive.startswith(("pragma", "if", "else", "elif", "endif", "define", "undef",
                                       "ifdef", "ifndef", "error", "warning", "line")):
                pass
            else:
                bad(i, f"preprocessor directive #{directive.split()[0] if directive else ''} is not allowed")
        code = _C_STRING.sub('""', ln)
        # A call or a declaration names the function with "(" after it; a macro may alias it.
        named = (_IDENT.findall(code) if s.startswith("#")
                 else [m.group(1) for m in _CALL.finditer(code)] + _ASM.findall(code))
        for name in dict.fromkeys(named):
            if name in FORBIDDEN_C:
                bad(i, f"{name!r}: a kernel may not do I/O, start processes, read the clock or "
                       f"the environment, or use inline asm")
            elif name in ("section", "__section__"):  # as an attribute: bytes of data placed in .text run as code
                bad(i, f"{name!r}: a kernel may not place code or data in a section of its choosing")
            elif name.startswith(("GOMP_", "omp_")) and not allowed_symbol(name):
                bad(i, f"{name!r}: {_openmp_why(name)}")
        m = re.search(r"__attribute__\s*\(\(.*\b(constructor|destructor|ifunc)\b", code)
        if m:
            bad(i, f"__attribute__(({m.group(1)})) runs code when the library loads")
        if "_Pragma" in code:
            bad(i, "_Pragma: write #pragma instead")
        if "__has_include" in code:  # a probe of the compiling machine's files
            bad(i, "__has_include: a kernel asks nothing of the machine's files")
    return sorted(out, key=lambda f: f.line)


# ---- the compiled object --------------------------------------------------------------------
# What a kernel's shared object may contain, read from the object itself (binutils' readelf and
# objdump, which every gcc installation has), so that what the source check cannot see (digraphs,
# token pasting, function pointers, extern declarations, names built by the preprocessor) is
# judged by what was built: the functions it links, the data it can keep, the code it runs at
# load time, the instructions it contains.

_LIBM = """sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh exp exp2 exp10 expm1
log log2 log10 log1p logb ilogb pow sqrt cbrt hypot fabs floor ceil round trunc rint nearbyint
lround llround lrint llrint fmod remainder remquo fma fmin fmax fdim copysign erf erfc tgamma
lgamma frexp ldexp modf scalbn scalbln nextafter nexttoward sincos nan""".split()
ALLOWED_SYMBOLS = ({f + s for f in _LIBM for s in ("", "f", "l")}
                   | {f"__{f}{s}_finite" for f in _LIBM for s in ("", "f", "l")}
                   | {"memcpy", "memset", "memmove", "memcmp", "malloc", "calloc", "realloc", "free",
                      "aligned_alloc", "posix_memalign", "__stack_chk_fail", "__memcpy_chk",
                      "__memset_chk", "__memmove_chk", "__assert_fail", "abs", "labs", "llabs",
                      "qsort", "bsearch",
                      # weak references every gcc shared object carries (crtstuff)
                      "__cxa_finalize", "__gmon_start__", "_ITM_deregisterTMCloneTable",
                      "_ITM_registerTMCloneTable"})
ALLOWED_PREFIXES = ("omp_", "_ZGV")  # OpenMP's API, libmvec's vector math
# libgomp's entry points that a compiler emits for OpenMP pragmas in host code: each parallel
# region ends (joins its team) before the entry returns. Not the split forms compilers no longer
# emit (GOMP_parallel_start ... GOMP_parallel_end), which return with the team still working:
# work after the call, untimed. Nor offloading (target, teams' league start, plugins). Names
# from gcc 12 to 14's libgomp.
_GOMP = re.compile(r"GOMP_(parallel(_loop_\w+|_sections|_reductions)?|loop_\w+|barrier(_cancel)?|"
                   r"critical(_name)?_(start|end)|atomic_(start|end)|single_start|single_copy_(start|end)|"
                   r"sections2?_\w+|ordered_(start|end)|doacross_\w+|task|taskwait(_depend(_nowait)?)?|taskyield|"
                   r"taskloop(_ull)?|task_reduction_remap|taskgroup_\w+|workshare_task_reduction_unregister|"
                   r"cancel|cancellation_point|scope_start|error|warning)")
_GOMP_SPLIT = re.compile(r"GOMP_parallel\w*_start")
# OpenMP's memory allocators (and `#pragma omp allocate`, which calls GOMP_alloc): their blocks
# come from the C library's heap, not the arena the kernel host clears between calls
# (tuner/backends/cpu_host.c), so a freed one would hand its contents to the next call.
_OMP_ALLOCATORS = ("omp_alloc", "omp_aligned_alloc", "omp_calloc", "omp_aligned_calloc", "omp_realloc",
                   "omp_free", "omp_init_allocator", "omp_destroy_allocator")
# Offloading, a detached task's completion, the API's printing (a kernel does no I/O) and its
# clock (omp_get_wtime: the clock through the vDSO, no system call, which a kernel may not
# read any more than through libc).
_OMP_DENIED = ("omp_target_", "omp_fulfill_event", "omp_display_", "omp_get_wtime", "omp_get_wtick",
               *_OMP_ALLOCATORS)
_OPENMP_WHY = ("of OpenMP a kernel may use the pragmas (and the omp_ API), not offloading or a team "
               "left running after the call (GOMP_parallel_start without its end): its work ends "
               "when it returns")


def _openmp_why(name: str) -> str:
    if name.startswith(("omp_get_wtime", "omp_get_wtick")):
        return "OpenMP's clock: a kernel may not read the clock"
    if name.startswith(_OMP_ALLOCATORS) or name in ("GOMP_alloc", "GOMP_free"):
        return ("OpenMP's memory allocators (and #pragma omp allocate): use malloc and free, whose "
                "blocks the kernel host clears between calls")
    return _OPENMP_WHY


def allowed_symbol(name: str) -> bool:
    """Whether a kernel's object may call `name` (see ALLOWED_SYMBOLS and _GOMP)."""
    if name in ALLOWED_SYMBOLS:
        return True
    if name.startswith("GOMP_"):
        return bool(_GOMP.fullmatch(name)) and not _GOMP_SPLIT.fullmatch(name)
    return name.startswith(ALLOWED_PREFIXES) and not name.startswith(_OMP_DENIED)


# Writable data every gcc shared object has (crtstuff): the DSO handle and a one-byte flag.
_CRT_DATA = {"__dso_handle", "completed.0", "completed.1", "__TMC_END__"}
_CRT_DATA_BYTES = 32
# Writable sections that are the loader's, not the kernel's (RELRO or tables it fills).
_LOADER_SECTIONS = {".got", ".got.plt", ".dynamic", ".init_array", ".fini_array"}
_SYSCALL = re.compile(r"\t(syscall|sysenter|int\s+\$0x80|svc\s|ecall)\b")
# The time-stamp and performance counters (x86), the generic timer's and the cycle counter
# (Arm): the clock, read without a call (an intrinsic, `__rdtsc()`), which a kernel may not
# read any more than through libc.
_CLOCK = re.compile(r"\t(rdtscp?|rdpid|rdpmc)\b|\b(cnt[vp]ct(ss)?|pmccntr)_el0\b")


def _readelf(*args: str, path: str) -> str:
    import subprocess
    return subprocess.run(["readelf", "-W", *args, path], capture_output=True, text=True,
                          timeout=60, check=True).stdout


def check_object(path: str, entry: str = "tuner_kernel") -> list[Finding]:
    """Why the shared object at `path` may not be loaded as a kernel (line 0: the object, not a
    source line), or []. Raises FileNotFoundError when binutils is missing."""
    import shutil
    import subprocess
    for tool in ("readelf", "objdump"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} not found: the cpu backend checks every compiled kernel "
                                    f"with binutils' readelf and objdump; install binutils")
    out: list[Finding] = []

    def bad(why: str) -> None:
        if all(f.why != why for f in out):
            out.append(Finding(0, "", why))

    sections: dict[int, tuple[str, str, int]] = {}  # index -> (name, flags, size)
    for m in re.finditer(r"^\s*\[\s*(\d+)\]\s+(\S+)\s+(\S+)\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)\s+"
                         r"[0-9a-f]+\s+([A-Za-z]*)\s", _readelf("-S", path=path), re.M):
        sections[int(m.group(1))] = (m.group(2), m.group(5), int(m.group(4), 16))
    by_name = {name: (flags, size) for name, flags, size in sections.values()}
    for name in (".init_array", ".fini_array"):
        if by_name.get(name, ("", 0))[1] > 8:  # one entry is crtstuff's own
            bad(f"{name}: the object runs code of its own when it is loaded or unloaded (a constructor "
                f"or destructor); a kernel does its work when it is called")
    for name in (".preinit_array", ".ctors", ".dtors"):
        if name in by_name:
            bad(f"{name}: the object runs code of its own when it is loaded or unloaded")
    writable = {i for i, (name, flags, _) in sections.items()
                if "W" in flags and name not in _LOADER_SECTIONS and not name.startswith(".data.rel.ro")
                and "A" in flags}
    data_bytes = sum(sections[i][2] for i in writable)
    kept = []
    defined_entry = False
    for line in _readelf("-s", path=path).splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit():
            continue
        size, kind, ndx, name = f[2], f[3], f[6], f[7].split("@")[0]
        if ndx == "UND":
            if name.startswith(("GOMP_", "omp_")) and not allowed_symbol(name):
                bad(f"calls {name!r}: {_openmp_why(name)}")
            elif name and not allowed_symbol(name):
                bad(f"calls {name!r}: a kernel may call math, OpenMP and memory functions only (no "
                    f"I/O, processes, clock, environment, signals or the Python API)")
            continue
        if name == entry and kind == "FUNC":
            defined_entry = True
        if kind == "IFUNC":  # its resolver runs when the loader binds it, before any call
            bad(f"an indirect function ({name}, __attribute__((ifunc)) or target_clones): its resolver "
                f"runs code of the object's own when it is loaded; a kernel does its work when it is "
                f"called (kernels are compiled for this CPU already: -march=native)")
        # objdump prints a data symbol's bytes as data, never as instructions: in an executable
        # section they would run unread by the instruction check below.
        if ndx.isdigit() and kind in ("OBJECT", "TLS") and "X" in sections.get(int(ndx), ("", "", 0))[1]:
            bad(f"data in an executable section ({name}): bytes a kernel wrote as data would run as "
                f"code the instruction check never read")
        if ndx.isdigit() and int(ndx) in writable and kind in ("OBJECT", "TLS", "NOTYPE") \
                and name not in _CRT_DATA and name:
            kept.append(f"{name} ({int(size, 0)} bytes)")
    if kept:
        bad(f"writable global or static data: {', '.join(sorted(set(kept))[:5])}: a kernel may "
            f"not keep state between calls (results or buffers seen before); make it a local, or "
            f"`const` for a table")
    elif data_bytes > _CRT_DATA_BYTES:
        bad(f"{data_bytes} bytes of writable data in the object: a kernel may not keep state "
            f"between calls")
    if any(sections[i][0] in (".tdata", ".tbss") for i in sections):
        bad("thread-local data: a kernel may not keep state between calls")
    if not defined_entry:
        bad(f"no exported `{entry}` entry: define `void {entry}(...)` with the op's arguments")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    m = _SYSCALL.search(text)
    if m:
        bad(f"a {m.group(1).split()[0]} instruction: a kernel may not call the kernel of the "
            f"operating system")
    m = _CLOCK.search(text)
    if m:
        bad(f"a {(m.group(1) or m.group(0)).split()[0]} instruction: a kernel may not read the clock")
    return out
