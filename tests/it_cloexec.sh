#!/usr/bin/env bash
# Every descriptor rk opens is close-on-exec unless it is meant to be inherited (issue 30: the
# ranks, the agents and the rsh processes held rk run's --events, --steps and --gate-log files,
# opened with fopen "a"). tests/cloexec_lint.py reads src/ and cli/ and names every fopen,
# open, socket, accept, pipe, dup, epoll, eventfd, ... call without its close-on-exec flag
# that carries no `rk-fd: WHY` comment; its self-test first shows that it names each kind of
# bad call in a sample and nothing else. (it_fds.sh checks the ranks' descriptors at run time.)
# Needs RK_SRC, RK_TMP (RK is not used); skips (77) without python3.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_cloexec

lint=$RK_SRC/tests/cloexec_lint.py
if python3 "$lint" --self-test >"$work/self.out" 2>&1; then
  ok "$(cat "$work/self.out")"
else
  bad "the lint's self-test: $(cat "$work/self.out")"
fi
if (cd "$RK_SRC" && python3 "$lint" src cli) >"$work/lint.out" 2>&1; then
  ok "every descriptor opened in src/ and cli/ is close-on-exec, or says why not (rk-fd:)"
else
  bad "descriptors without close-on-exec:"$'\n'"$(cat "$work/lint.out")"
fi
it_finish
