"""The C kernel checker (cpu backend): what a kernel source may include and call.

`#include` only of standard math/OpenMP/stdlib/SIMD headers; no calls to
system/exec*/fork/popen/fopen/dlopen/syscall/socket/getenv and kin; no inline asm, no
constructor/destructor attributes, no token pasting (`##`) or computed includes that would
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
        m = re.search(r"__attribute__\s*\(\(.*\b(constructor|destructor)\b", code)
        if m:
            bad(i, f"__attribute__(({m.group(1)})) runs code when the library loads")
        if "_Pragma" in code:
            bad(i, "_Pragma: write #pragma instead")
    return sorted(out, key=lambda f: f.line)
