#!/bin/sh
# Installs the Debian packages the build and the tests need, only when something is missing.
set -e
PKGS="build-essential pkg-config libjansson-dev libcmocka-dev libpcre2-dev libutf8proc-dev clang libclang-rt-14-dev json-schema-test-suite"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "installing:$missing" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
