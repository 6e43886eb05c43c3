#!/bin/sh
# make install, as a packager (DESTDIR) and as a user (PREFIX) would run it:
# a tiny C program built against the installed libattn with nothing but
# `pkg-config --cflags --libs attn` computes Worked Example 1, the installed
# attnd runs, and systemd-analyze accepts the installed unit without a
# warning.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { echo "ok     $1"; pass=$((pass + 1)); }
bad() { echo "FAILED $1"; fail=$((fail + 1)); }
# This runs inside `make test`: the outer make's variables (the sanitizer
# pass's BUILD, SAN) must not reach the install, which is of the plain build.
inst() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$root" install BUILD=build "$@"; }

if inst DESTDIR="$tmp/stage" PREFIX=/opt/attn >"$tmp/make.log" 2>&1; then
    ok "make install DESTDIR=... PREFIX=/opt/attn"
else
    cat "$tmp/make.log"; bad "make install DESTDIR=... PREFIX=/opt/attn"
fi
for f in bin/attnd include/attn.h lib/libattn.a lib/pkgconfig/attn.pc lib/systemd/system/attnd.service; do
    [ -f "$tmp/stage/opt/attn/$f" ] && ok "installs $f" || bad "installs $f"
done
grep -qx "prefix=/opt/attn" "$tmp/stage/opt/attn/lib/pkgconfig/attn.pc" && ok "attn.pc names the PREFIX, not DESTDIR" || bad "attn.pc prefix"

cat > "$tmp/example1.c" <<'C'
/* Worked Example 1 through the installed libattn. */
#include <attn.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.batch = p.heads_q = p.heads_kv = 1;
    p.n_q = p.n_k = p.d_k = p.d_v = 2;
    p.scale = attn_default_scale(2);
    p.mask.kind = ATTN_MASK_NONE;
    p.threads = 1;
    const float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4};
    float out[4], w[4];
    attn_error err;
    if (attn_sdpa_forward(&p, q, k, v, out, NULL, w, NULL, &err) != ATTN_OK) {
        fprintf(stderr, "attn_sdpa_forward failed\n");
        return 1;
    }
    printf("libattn %s weights %.4f %.4f output %.4f %.4f\n", attn_version(), w[0], w[1], out[0], out[1]);
    return 0;
}
C
# As a user installs it: PREFIX only, then pkg-config finds it.
if inst PREFIX="$tmp/usr" >"$tmp/make2.log" 2>&1; then ok "make install PREFIX=..."; else cat "$tmp/make2.log"; bad "make install PREFIX=..."; fi
flags=$(PKG_CONFIG_PATH="$tmp/usr/lib/pkgconfig" pkg-config --cflags --libs attn 2>&1)
echo "       pkg-config --cflags --libs attn: $flags"
if ${CC:-cc} -std=c11 -Wall -Werror -o "$tmp/example1" "$tmp/example1.c" $flags 2>"$tmp/cc.log"; then
    ok "a program builds with pkg-config --cflags --libs attn"
    out=$("$tmp/example1")
    echo "       $out"
    case "$out" in
        "libattn "*" weights 0.6698 0.3302 output 1.6605 2.6605") ok "it computes Worked Example 1" ;;
        *) bad "it computes Worked Example 1 (got: $out)" ;;
    esac
else
    cat "$tmp/cc.log"; bad "a program builds with pkg-config --cflags --libs attn"
fi
"$tmp/usr/bin/attnd" --version | grep -q "^attnd " && ok "the installed attnd runs" || bad "the installed attnd runs"

# The unit, installed where its ExecStart exists, checked by systemd.
if command -v systemd-analyze >/dev/null; then
    unit="$tmp/usr/lib/systemd/system/attnd.service"
    grep -q "^ExecStart=$tmp/usr/bin/attnd$" "$unit" && ok "the unit starts the installed attnd" || bad "the unit's ExecStart"
    if systemd-analyze verify "$unit" >"$tmp/verify.log" 2>&1 && [ ! -s "$tmp/verify.log" ]; then
        ok "systemd-analyze verify: no error, no warning"
    else
        cat "$tmp/verify.log"; bad "systemd-analyze verify"
    fi
    for k in DynamicUser=yes NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes KillSignal=SIGTERM; do
        grep -qx "$k" "$unit" && ok "unit has $k" || bad "unit has $k"
    done
else
    echo "SKIPPED the systemd unit check: no systemd-analyze on this machine (Debian package systemd; tools/deps.sh test installs it)"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
