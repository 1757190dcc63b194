#!/usr/bin/env bash
# Builds the project's environment if needed; safe to run again (it does nothing when the
# environment already matches pyproject.toml and requirements.lock).
#   - checks for Java 17 (Spark needs it) and installs openjdk-17-jre-headless through apt
#     where it is missing;
#   - checks for Chromium and its WebDriver (the console's browser tests, tests/browser) and
#     installs chromium and chromium-driver through apt where they are missing (a machine
#     where that fails still builds: those tests then skip and say why);
#   - checks for PostgreSQL's JDBC driver (/usr/share/java/postgresql.jar: the Spark
#     connector benchmark reads PostgreSQL through Spark's JDBC source) and installs
#     libpostgresql-jdbc-java through apt where it is missing (without it only that
#     benchmark refuses to run);
#   - creates .venv with Python 3.11 and installs the pinned dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[bootstrap] error:\033[0m %s\n' "$*" >&2; exit 1; }

java_major() {
  command -v java >/dev/null 2>&1 || { echo 0; return; }
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

# apt_install WHAT PACKAGE...: installs the Debian packages, as root or through sudo.
# Returns non-zero (after saying why) when it cannot; the caller decides whether that is fatal.
apt_install() {
  local what=$1; shift
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    say "$what is missing and this user cannot install packages. Install it with: apt-get install $*"
    return 1
  fi
  local SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  command -v apt-get >/dev/null 2>&1 || { say "$what is missing and apt-get is not available: install $* by hand"; return 1; }
  $SUDO apt-get update -qq || { say "apt-get update failed: install $* by hand"; return 1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || { say "apt-get install $* failed; install $what by hand"; return 1; }
}

major=$(java_major)
if [ "${major:-0}" -lt 17 ]; then
  say "Java 17 not found (found: ${major:-none}); installing openjdk-17-jre-headless"
  apt_install "Java 17" openjdk-17-jre-headless || die "a Java 17 runtime is required (Spark)"
  major=$(java_major)
  [ "${major:-0}" -ge 17 ] || die "Java 17 still not on PATH after installing it"
fi

# Debian's names; other distributions' chromium-browser/chromedriver are found too.
if ! { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; } \
   || ! command -v chromedriver >/dev/null 2>&1; then
  say "Chromium or its driver not found; installing chromium and chromium-driver (browser tests)"
  apt_install "Chromium" chromium chromium-driver \
    || say "the browser tests (tests/browser) will skip until chromium and chromium-driver are installed"
fi

# Debian's path; bench/spark_connector.py looks for the driver there.
if [ ! -f /usr/share/java/postgresql.jar ]; then
  say "PostgreSQL's JDBC driver not found; installing libpostgresql-jdbc-java (bench.spark_connector)"
  apt_install "PostgreSQL's JDBC driver" libpostgresql-jdbc-java \
    || say "bench.spark_connector will refuse to run until libpostgresql-jdbc-java is installed"
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || die "Python 3.11 is required (set PYTHON=/path/to/python3.11)"

stamp=.venv/.shardex-env
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
say "installing pinned dependencies into .venv (first time: a few minutes, pyspark is large)"
.venv/bin/python -m pip install -q -r requirements.lock
.venv/bin/python -m pip install -q --no-deps -e .
echo "$want" > "$stamp"
say "environment ready"
