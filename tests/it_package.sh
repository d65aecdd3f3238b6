#!/usr/bin/env bash
# make package's Debian packages (docs/packaging.md) are what they say:
# - rekindle, librekindle0 and rekindle-dev exist, and dpkg-deb --contents lists what each
#   should carry (rk, the man page, the Python package, the docs, the units, /etc/rekindle's
#   settings as conffiles; the library under its SONAME; headers, rekindle.pc, the .so link)
#   and nothing of the tests or benchmarks, no Python bytecode;
# - Depends has the runtime libraries (dpkg-shlibdeps), python3 and python3-xxhash, and no
#   Prometheus, compiler or -dev package;
# - rk.1 has a section for every command `rk --help` lists, renders without groff warnings,
#   and is gzip -9n (no name, no time stamp);
# - systemd-analyze verify accepts the units, in a scratch root the packages were installed
#   into (dpkg --root), where R/usr/bin/rk --version runs, a program builds against
#   rekindle-dev with pkg-config and runs, and the Python package imports; removing keeps the
#   conffiles, purging removes them;
# - lintian --allow-root reports no error and no warning (overrides carry their reason);
# - a plain cmake --install (make install) installs neither the units nor /etc/rekindle,
#   and --component rekindle does.
# The .debs come from make package (make test builds them first): RK_PKG_DIR, default
# $RK_SRC/build-pkg/packages.
set -u
. "$(dirname "$0")/itlib.sh"
RK_BUILD=${RK_BUILD:?}
pkgdir=${RK_PKG_DIR:-$RK_SRC/build-pkg/packages}
for tool in dpkg-deb dpkg lintian systemd-analyze; do
  command -v "$tool" >/dev/null ||
    { echo "SKIP: $tool not found (scripts/install-deps.sh test installs lintian and systemd)"; exit 77; }
done
shopt -s nullglob
debs=("$pkgdir"/*.deb)
if [[ ${#debs[@]} -eq 0 ]]; then
  echo "SKIP: no .deb in $pkgdir: make package builds them (make test does, before the tests)"
  exit 77
fi
it_init it_package
arch=$(dpkg --print-architecture)
ver=$("$RK" --version | awk '{print $2}')
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
declare -A deb
for p in rekindle librekindle0 rekindle-dev; do
  f=$pkgdir/${p}_${ver}_${arch}.deb
  if [[ -f $f ]]; then deb[$p]=$f; ok "$p: $(basename "$f")"
  else bad "$p: no $(basename "$f") in $pkgdir (rk --version says $ver)"; fi
done
if [[ ${#deb[@]} -ne 3 ]]; then
  it_finish
  exit
fi

# ---- contents -----------------------------------------------------------------------------
for p in "${!deb[@]}"; do
  # perms owner size date time PATH [-> TARGET]
  dpkg-deb --contents "${deb[$p]}" | awk '{print $6}' | sed 's|^\./|/|; s|/$||' >"$work/$p.list"
done
has() { # PACKAGE PATH...: each PATH is in PACKAGE's file list
  local p=$1 missing=""
  shift
  for f in "$@"; do grep -qxF "$f" "$work/$p.list" || missing="$missing $f"; done
  if [[ -z $missing ]]; then ok "$p carries $*"; else bad "$p lacks:$missing"; fi
}
lib=/usr/lib/$multiarch
has rekindle /usr/bin/rk /usr/share/man/man1/rk.1.gz "$lib/rekindle/librkloopback.so" \
  /usr/lib/python3/dist-packages/rekindle/__init__.py /usr/lib/python3/dist-packages/rekindle/ckpt.py \
  /usr/share/doc/rekindle/copyright /usr/share/doc/rekindle/changelog.gz \
  /usr/share/doc/rekindle/README.md /usr/share/doc/rekindle/packaging.md \
  /lib/systemd/system/rk-exporter.service /lib/systemd/system/rk-tune.service \
  /etc/rekindle/exporter.conf /etc/rekindle/tune.conf
has librekindle0 "$lib/librekindle.so.0" "$lib/librekindle.so.$ver" \
  /usr/share/doc/librekindle0/copyright /usr/share/doc/librekindle0/changelog.gz
has rekindle-dev "$lib/librekindle.so" "$lib/pkgconfig/rekindle.pc" /usr/include/rekindle/ckpt.h \
  /usr/share/doc/rekindle-dev/copyright
if grep -q "librekindle\.so$" "$work/librekindle0.list" "$work/rekindle.list"; then
  bad "the librekindle.so link is outside rekindle-dev"
else ok "the librekindle.so link is in rekindle-dev only"; fi
nheaders=$(grep -c '^/usr/include/rekindle/.*\.h$' "$work/rekindle-dev.list")
nsource=$(ls "$RK_SRC"/include/rekindle/*.h | wc -l)
if [[ $nheaders -eq $nsource ]]; then ok "rekindle-dev has all $nsource headers of include/rekindle/"
else bad "rekindle-dev has $nheaders headers, include/rekindle/ $nsource"; fi
stray=$(cat "$work"/*.list | grep -E '/tests?/|/bench/|/test_[^/]*$|fake_nvml|comm_check|mkmodel|_bench$|__pycache__|\.pyc$|\.o$|\.a$' || true)
if [[ -z $stray ]]; then ok "no file of tests/ or bench/, no test program, no bytecode in the packages"
else bad "packaged but should not be: $(echo $stray)"; fi
dpkg-deb --ctrl-tarfile "${deb[rekindle]}" | tar -xO ./conffiles >"$work/conffiles" 2>/dev/null
if [[ $(sort "$work/conffiles" | tr '\n' ' ') == "/etc/rekindle/exporter.conf /etc/rekindle/tune.conf " ]]
then ok "conffiles: $(tr '\n' ' ' <"$work/conffiles")"
else bad "conffiles are not the two settings files: $(tr '\n' ' ' <"$work/conffiles")"; fi
other_etc=$(grep '^/etc/' "$work/librekindle0.list" "$work/rekindle-dev.list" || true)
[[ -z $other_etc ]] && ok "only rekindle has files in /etc" || bad "files in /etc: $other_etc"

# ---- control fields -----------------------------------------------------------------------
for p in "${!deb[@]}"; do
  fields=$(dpkg-deb -f "${deb[$p]}" Depends Pre-Depends Recommends)
  forbidden=$(printf '%s\n' "$fields" | tr ',|' '\n\n' | sed 's/^.*: //; s/^ *//; s/ .*//' |
    grep -E '^(prometheus.*|clang.*|gcc.*|cpp.*|g\+\+.*|build-essential|cmake|.*-dev|libcmocka.*|lintian)$' |
    grep -vx 'rekindle-dev' || true)
  if [[ -z $forbidden ]]; then ok "$p: Depends/Recommends name no Prometheus, compiler or -dev package"
  else bad "$p depends on: $(echo $forbidden)"; fi
done
dep=$(dpkg-deb -f "${deb[rekindle]}" Depends)
miss=""
for d in libc6 python3 python3-xxhash openmpi-bin libjansson4; do
  printf '%s' "$dep" | tr ',' '\n' | grep -qE "^ *$d( |$)" || miss="$miss $d"
done
if [[ -z $miss ]]; then ok "rekindle Depends: $dep"; else bad "rekindle Depends lacks$miss: $dep"; fi
shl=$(dpkg-deb --ctrl-tarfile "${deb[librekindle0]}" | tar -xO ./shlibs 2>/dev/null)
if [[ $shl == "librekindle 0 librekindle0 (>= $ver)" ]]; then ok "librekindle0 shlibs: $shl"
else bad "librekindle0 shlibs: '$shl'"; fi
dpkg-deb --fsys-tarfile "${deb[librekindle0]}" | tar -xO ".$lib/librekindle.so.$ver" >"$work/so"
soname=$(readelf -d "$work/so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == librekindle.so.0 ]] && ok "SONAME librekindle.so.0" || bad "SONAME is '$soname'"

# ---- the man page -------------------------------------------------------------------------
dpkg-deb --fsys-tarfile "${deb[rekindle]}" | tar -xO ./usr/share/man/man1/rk.1.gz >"$work/rk.1.gz"
# gzip header: byte 3 the flags (8: a file name), bytes 4-7 the time stamp
hdr=$(od -An -tu1 -j3 -N5 "$work/rk.1.gz" | tr -s ' ')
if [[ $hdr == " 0 0 0 0 0" ]]; then ok "rk.1.gz is gzip -n: no name, no time stamp"
else bad "rk.1.gz's gzip header carries a name or a time (flags, mtime:$hdr)"; fi
zcat "$work/rk.1.gz" >"$work/rk.1"
cmds=$("$RK" --help | awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on && /^  [a-z]/ {print $1}')
nomen=""
for c in $cmds; do
  grep -qx "\.SS rk ${c//-/\\\\-}" "$work/rk.1" || grep -qx "\.SS rk $c" "$work/rk.1" || nomen="$nomen $c"
done
if [[ -n $cmds && -z $nomen ]]; then ok "rk.1 has a section for each of: $(echo $cmds)"
else bad "rk.1 lacks the commands:$nomen (of: $(echo $cmds))"; fi
exp_help=$("$RK" tune --help | head -1 | sed 's/-/\\-/g')
grep -qxF "$exp_help" "$work/rk.1" && ok "rk.1 quotes rk tune --help verbatim" ||
  bad "rk.1 does not have rk tune --help's first line: $exp_help"
if command -v groff >/dev/null; then
  warn=$(groff -man -Tutf8 -ww -z "$work/rk.1" 2>&1)
  [[ -z $warn ]] && ok "rk.1 renders without groff warnings" || bad "groff: $(echo "$warn" | head -3)"
else echo "note: groff not found, rk.1 not rendered"; fi

# ---- a scratch root -----------------------------------------------------------------------
R=$work/root
mkdir -p "$R"/var/lib/dpkg/{info,updates,triggers,alternatives} "$R/var/log"
touch "$R/var/lib/dpkg/status" "$R/var/lib/dpkg/available"
dpkgr=(dpkg --root="$R" --log=/dev/null --force-depends --force-script-chrootless)
if "${dpkgr[@]}" -i "${deb[@]}" >"$work/dpkg.log" 2>&1; then
  ok "dpkg --root installs the three packages"
else bad "dpkg --root -i: $(grep -v '^ ' "$work/dpkg.log" | tail -3)"; fi
v=$(LD_LIBRARY_PATH=$R$lib "$R/usr/bin/rk" --version 2>&1)
[[ $v == "rk $ver" ]] && ok "R/usr/bin/rk --version: $v" || bad "R/usr/bin/rk --version: $v"
status=$(dpkg-query --admindir="$R/var/lib/dpkg" -W -f='${Package}:${Status} ' 2>/dev/null)
[[ $status == *"rekindle:install ok installed"* ]] && ok "dpkg in R: $status" || bad "dpkg in R: $status"
# librekindle as a user of rekindle-dev builds against it: pkg-config finds it in R
cat >"$work/user.c" <<'EOF'
#include <rekindle/error.h>
#include <rekindle/rng.h>
#include <stdio.h>
int main(void)
{
    rk_rng r;
    rk_rng_seed(&r, 7);
    printf("%s %llu\n", rk_strerror(0) ? "ok" : "null", (unsigned long long)rk_rng_below(&r, 10));
    return 0;
}
EOF
# shellcheck disable=SC2046
if cc -std=c17 -Wall -Werror "$work/user.c" -o "$work/user" \
  $(PKG_CONFIG_PATH=$R$lib/pkgconfig pkg-config --cflags --libs rekindle) >"$work/cc.log" 2>&1 &&
  out=$(LD_LIBRARY_PATH=$R$lib "$work/user") && [[ $out == ok* ]]; then
  ok "a program built with R's rekindle.pc links R's librekindle.so.0 and runs ($out)"
else bad "building against R's rekindle-dev: $(head -3 "$work/cc.log") ${out:-}"; fi
needed=$(readelf -d "$work/user" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(librekindle[^]]*\)\]/\1/p')
[[ $needed == librekindle.so.0 ]] && ok "the program needs librekindle.so.0 (the SONAME)" ||
  bad "the program needs '$needed', not librekindle.so.0"
# Debian's python3, the one the package depends on (not a python3 of pyenv or a venv)
py=$(PYTHONPATH=$R/usr/lib/python3/dist-packages /usr/bin/python3 -c \
  'import rekindle, rekindle.ckpt, rekindle.worker; print(rekindle.__file__)' 2>&1)
[[ $py == "$R/usr/lib/python3/dist-packages/rekindle/__init__.py" ]] &&
  ok "the Python package imports from R" || bad "python3 -c 'import rekindle' from R: $py"
# rk run puts <prefix>/share/rekindle/python on its ranks' PYTHONPATH: there, a link to it
# and nothing else (not all of dist-packages)
run_dir=$R/usr/share/rekindle/python
if [[ $(ls -A "$run_dir" 2>&1) == rekindle && -f $run_dir/rekindle/__init__.py &&
      $(readlink -f "$run_dir/rekindle") == "$R/usr/lib/python3/dist-packages/rekindle" ]]; then
  ok "share/rekindle/python (rk run's ranks' PYTHONPATH) holds only a link to the package"
else bad "share/rekindle/python: $(ls -lA "$run_dir" 2>&1 | tail -n +2)"; fi

# ---- the units ----------------------------------------------------------------------------
# systemd-analyze --root needs the targets they refer to: the host's units, copied in
cp -rn --no-dereference /lib/systemd/system/. "$R/lib/systemd/system/" 2>/dev/null
out=$(systemd-analyze verify --man=no --root="$R" rk-exporter.service rk-tune.service 2>&1)
rc=$?
if [[ $rc -eq 0 && -z $out ]]; then ok "systemd-analyze verify accepts rk-exporter.service and rk-tune.service"
else bad "systemd-analyze verify (status $rc): $(echo "$out" | head -5)"; fi
for u in rk-exporter rk-tune; do
  lvl=$(systemd-analyze security --offline=yes --root="$R" "$u.service" 2>/dev/null |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p')
  case $lvl in
    *" OK") ok "systemd-analyze security $u.service: $lvl" ;;
    *) bad "systemd-analyze security $u.service: '${lvl}' (want OK: exposure below 4)" ;;
  esac
done
unit=$R/lib/systemd/system/rk-exporter.service
for want in DynamicUser=yes ProtectSystem=strict ProtectHome=yes NoNewPrivileges=yes \
  PrivateTmp=yes PrivateDevices=no CapabilityBoundingSet=CAP_SYSLOG \
  "EnvironmentFile=/etc/rekindle/exporter.conf" "SystemCallFilter=@system-service"; do
  grep -qxF "$want" "$unit" || lacks="${lacks:-} $want"
done
[[ -z ${lacks:-} ]] && ok "rk-exporter.service: a dynamic user, read-only, CAP_SYSLOG only" ||
  bad "rk-exporter.service lacks$lacks"
grep -qx 'ExecStart=/usr/bin/rk tune $RK_TUNE_ARGS' "$R/lib/systemd/system/rk-tune.service" &&
  grep -qx 'Type=oneshot' "$R/lib/systemd/system/rk-tune.service" &&
  ok "rk-tune.service: oneshot, rk tune \$RK_TUNE_ARGS" || bad "rk-tune.service's ExecStart or Type"
# the settings the units read, as systemd would: each NAME=value line, then the exporter's
# default listen address parses
# shellcheck disable=SC1090
(. "$R/etc/rekindle/exporter.conf" && [[ $RK_EXPORTER_LISTEN == 127.0.0.1:9258 ]]) &&
  ok "exporter.conf: RK_EXPORTER_LISTEN=127.0.0.1:9258" || bad "exporter.conf's RK_EXPORTER_LISTEN"

# ---- remove, purge ------------------------------------------------------------------------
"${dpkgr[@]}" -r rekindle >"$work/rm.log" 2>&1
if [[ ! -e $R/usr/bin/rk && -f $R/etc/rekindle/exporter.conf ]]; then
  ok "dpkg -r rekindle removes rk and keeps the conffiles"
else bad "after dpkg -r: rk $( [[ -e $R/usr/bin/rk ]] && echo present || echo gone), exporter.conf $( [[ -f $R/etc/rekindle/exporter.conf ]] && echo kept || echo gone)"; fi
"${dpkgr[@]}" --purge rekindle >>"$work/rm.log" 2>&1
[[ ! -e $R/etc/rekindle ]] && ok "dpkg --purge rekindle removes /etc/rekindle" ||
  bad "after --purge: $(ls "$R/etc/rekindle" 2>&1)"

# ---- lintian ------------------------------------------------------------------------------
lintian --allow-root --no-cfg "${deb[@]}" >"$work/lintian.log" 2>&1
lrc=$?
ew=$(grep -E '^[EW]: ' "$work/lintian.log")
if [[ -z $ew && $lrc -eq 0 ]]; then
  ok "lintian: no error, no warning ($(lintian --allow-root --no-cfg --show-overrides "${deb[@]}" 2>/dev/null | grep -c '^O: ') overridden, each with its reason)"
else bad "lintian (status $lrc): $(echo "$ew" | head -8)"; fi

# ---- make install leaves /etc and the units alone -----------------------------------------
if cmake --install "$RK_BUILD" --prefix "$work/plain" >"$work/plain.log" 2>&1; then
  extra=$(cd "$work/plain" && find . -path ./etc -o -path '*/systemd/*' -o -path '*/lintian/*' | head -3)
  [[ -z $extra && -x $work/plain/bin/rk ]] &&
    ok "cmake --install (make install): rk and no units, no etc/, no lintian overrides" ||
    bad "cmake --install installed: $extra"
  cmake --install "$RK_BUILD" --prefix "$work/comp" --component rekindle >"$work/comp.log" 2>&1
  [[ -f $work/comp/etc/rekindle/exporter.conf && -f $work/comp/lib/systemd/system/rk-exporter.service ]] &&
    ok "cmake --install --component rekindle adds the units and etc/rekindle under the prefix" ||
    bad "--component rekindle: $(tail -2 "$work/comp.log")"
else bad "cmake --install: $(tail -3 "$work/plain.log")"; fi

it_finish
