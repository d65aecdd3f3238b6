#!/usr/bin/env python3
"""Every descriptor rk opens is close-on-exec unless it is meant to be inherited.

Reads the C sources under the directories given (the repository's src/ and cli/) and names,
one line each, every call that makes a descriptor without asking for close-on-exec:

  fopen, freopen, popen         the mode, a string literal, has "e"
  open, openat, open64          O_CLOEXEC among the flags
  socket, socketpair, accept4   SOCK_CLOEXEC          (accept: never; accept4)
  pipe2, dup3                   O_CLOEXEC             (pipe, dup: never; pipe2, F_DUPFD_CLOEXEC)
  dup2                          onto stdin, stdout or stderr only
  fcntl                         F_DUPFD_CLOEXEC, not F_DUPFD
  epoll_create1, eventfd, timerfd_create, signalfd, memfd_create, inotify_init1, mkostemp(s)
                                EPOLL_CLOEXEC, EFD_, TFD_, SFD_, MFD_, IN_CLOEXEC, O_CLOEXEC
  epoll_create, inotify_init, mkstemp(s), tmpfile, creat        never
  fdopen, fdopendir             the descriptor's own flag decides ("e" is ignored): say where
                                it came from
(opendir is fine: glibc opens the directory O_CLOEXEC.)

A call that is meant to be as it is carries a comment with `rk-fd:` and the reason, on one
of its lines or in the three lines above (`/* rk-fd: inherited: the rank's stdin */`).

Usage: cloexec_lint.py DIR...    exit 0 clean, 1 findings (listed), 2 bad usage
       cloexec_lint.py --self-test
"""
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree (it may be read-only)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from csource import blank  # noqa: E402  (comments and literals, shared with scripts/)

# name -> (rule, what to ask for)
NEVER = {
    "accept": "accept4(..., SOCK_CLOEXEC)",
    "pipe": "pipe2(..., O_CLOEXEC)",
    "dup": "fcntl(fd, F_DUPFD_CLOEXEC, 0)",
    "epoll_create": "epoll_create1(EPOLL_CLOEXEC)",
    "inotify_init": "inotify_init1(IN_CLOEXEC)",
    "mkstemp": "mkostemp(..., O_CLOEXEC)",
    "mkstemps": "mkostemps(..., O_CLOEXEC)",
    "tmpfile": "open(..., O_TMPFILE | O_CLOEXEC) or a named file opened O_CLOEXEC",
    "creat": "open(..., O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC)",
}
FLAG = {
    "open": "O_CLOEXEC",
    "open64": "O_CLOEXEC",
    "openat": "O_CLOEXEC",
    "socket": "SOCK_CLOEXEC",
    "socketpair": "SOCK_CLOEXEC",
    "accept4": "SOCK_CLOEXEC",
    "pipe2": "O_CLOEXEC",
    "epoll_create1": "EPOLL_CLOEXEC",
    "eventfd": "EFD_CLOEXEC",
    "timerfd_create": "TFD_CLOEXEC",
    "signalfd": "SFD_CLOEXEC",
    "memfd_create": "MFD_CLOEXEC",
    "inotify_init1": "IN_CLOEXEC",
    "mkostemp": "O_CLOEXEC",
    "mkostemps": "O_CLOEXEC",
}
MODE = {"fopen": 1, "freopen": 1, "popen": 1}  # the mode's argument index
FROM_FD = {"fdopen", "fdopendir"}
STD = {"0", "1", "2", "STDIN_FILENO", "STDOUT_FILENO", "STDERR_FILENO"}
NAMES = set(NEVER) | set(FLAG) | set(MODE) | FROM_FD | {"dup2", "dup3", "fcntl"}
CALL = re.compile(r"(?<![\w.>*])(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")\s*\(")
MARK = re.compile(r"rk-fd:\s*\S")


def args_of(code, start):
    """The arguments of the call whose '(' is at start: (list of (begin, end)), end offset."""
    depth, begin, parts = 0, start + 1, []
    for k in range(start, len(code)):
        ch = code[k]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                parts.append((begin, k))
                return parts, k
        elif ch == "," and depth == 1:
            parts.append((begin, k))
            begin = k + 1
    return parts, len(code)


def problem(name, args):
    """What is wrong with a call (its arguments' text, comments blanked), None if nothing."""
    if name in NEVER:
        return f"{name}() makes an inheritable descriptor: use {NEVER[name]}"
    if name in FLAG:
        return None if FLAG[name] in " ".join(args) else f"{name}() without {FLAG[name]}"
    if name in MODE:
        i = MODE[name]
        m = re.fullmatch(r'\s*"([^"\\]*)"\s*', args[i]) if len(args) > i else None
        if not m:
            return f"{name}() with a mode that is not a string literal (cannot check for \"e\")"
        return None if "e" in m.group(1) else f'{name}() mode "{m.group(1)}" without "e"'
    if name in FROM_FD:
        return f"{name}() takes the descriptor's own flag: say where it came from (rk-fd:)"
    if name == "dup2":
        return None if len(args) > 1 and args[1].strip() in STD else \
            "dup2() onto a descriptor other than stdin, stdout, stderr: use dup3(..., O_CLOEXEC)"
    if name == "dup3":
        if len(args) > 1 and args[1].strip() in STD:
            return None
        return None if "O_CLOEXEC" in " ".join(args) else "dup3() without O_CLOEXEC"
    if name == "fcntl":
        a = " ".join(args)
        return "fcntl(F_DUPFD): use F_DUPFD_CLOEXEC" if re.search(r"\bF_DUPFD\b", a) else None
    return None


def lint_text(path, text):
    """[(line, message)] for one file's text."""
    code = blank(text, strings=True)
    nocomment = blank(text, strings=False)
    lines = text.split("\n")
    found = []
    for m in CALL.finditer(code):
        name = m.group(1)
        before = code[:m.start()].rstrip()
        # a declaration or a definition, not a call: "int open(" / "FILE *fopen("
        if re.search(r"(\b(int|void|FILE|DIR|ssize_t|pid_t)\s*\**|\*)\s*$", before) and \
                not re.search(r"(=|return|\(|,)\s*$", before):
            continue
        parts, end = args_of(code, m.end() - 1)
        args = [nocomment[b:e] for b, e in parts]
        why = problem(name, args)
        if not why:
            continue
        first = text.count("\n", 0, m.start())
        last = text.count("\n", 0, end)
        window = "\n".join(lines[max(0, first - 3):last + 1])
        if MARK.search(window):
            continue
        found.append((first + 1, why))
    return found


def lint_tree(dirs):
    found = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    p = os.path.join(root, f)
                    with open(p, encoding="utf-8", errors="replace") as fh:
                        found += [(p, ln, why) for ln, why in lint_text(p, fh.read())]
    return found


# The self-test: each call whose first line ends in "// BAD" must be named, and no other.
SAMPLE = r'''
FILE *a = fopen(p, "a"); // BAD
FILE *b = fopen(p, "ae");
FILE *c = fopen(p, mode); // BAD
FILE *d = fopen("x\"e", "w"); // BAD
int e = open(p, O_RDONLY); // BAD
int f = open(p,
             O_RDONLY | O_CLOEXEC);
int g = open(p, // BAD
             O_WRONLY | O_CREAT, /* O_CLOEXEC in a comment does not count */ 0644);
int h = openat(dfd, n, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
int i = socket(AF_UNIX, SOCK_STREAM, 0); // BAD
int j = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
int k = accept(l, NULL, NULL); // BAD
int l2 = accept4(l, NULL, NULL, SOCK_NONBLOCK); // BAD
int m = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
pipe(fds); // BAD
pipe2(fds, 0); // BAD
pipe2(fds, O_CLOEXEC);
int n = dup(fd); // BAD
dup2(fd, STDIN_FILENO);
dup2(fd, 7); // BAD
dup3(fd, 7, O_CLOEXEC);
fcntl(fd, F_DUPFD, 3); // BAD
fcntl(fd, F_DUPFD_CLOEXEC, 3);
fcntl(fd, F_SETFL, O_NONBLOCK);
int o = epoll_create1(0); // BAD
int q = eventfd(0, EFD_NONBLOCK); // BAD
int r = signalfd(-1, &set, SFD_CLOEXEC);
int t = mkstemp(tmpl); // BAD
FILE *u = fdopen(fd, "r"); // BAD
/* rk-fd: the descriptor is O_CLOEXEC from rk_file_open_read */
FILE *v = fdopen(fd, "r");
int w = open("/dev/null", O_RDONLY); /* rk-fd: inherited: becomes stdin */
int x = ops->open(c, err);
int y = s.open(c);
int z = rk_thing_open(c);
/* open(p, O_RDONLY) in a comment is not a call */
const char *s2 = "socket(AF_UNIX, SOCK_STREAM, 0)";
static int open(int x);
DIR *dd = opendir(p);
FILE *pp = popen(cmd, "r"); // BAD
'''


def self_test():
    want = [i + 1 for i, l in enumerate(SAMPLE.split("\n")) if l.rstrip().endswith("// BAD")]
    got = [ln for ln, _ in lint_text("sample", SAMPLE)]
    if got != want:
        print(f"cloexec_lint self-test FAILED: named lines {got}, want {want}")
        for ln, why in lint_text("sample", SAMPLE):
            print(f"  sample:{ln}: {why}: {SAMPLE.split(chr(10))[ln - 1].strip()}")
        return 1
    print(f"cloexec_lint self-test: the {len(want)} bad calls of the sample named, no other")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if not argv or any(a.startswith("-") or not os.path.isdir(a) for a in argv):
        print("usage: cloexec_lint.py DIR... | --self-test (each DIR a directory)", file=sys.stderr)
        return 2
    found = lint_tree(argv)
    for p, ln, why in found:
        print(f"{p}:{ln}: {why}")
    if found:
        print(f"cloexec_lint: {len(found)} descriptor(s) opened without close-on-exec: add the "
              "flag, or a comment `rk-fd: WHY` where the descriptor is meant to be inherited")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
