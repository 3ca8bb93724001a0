#!/bin/sh
# Entry point of the server image (top-level Dockerfile): `ptc ARGS...`.
#
# `ptc serve` on anything but loopback needs a tenants file (API keys), so the default command
# names one: $PTC_TENANTS (default /var/lib/ptc/tenants.toml). Mount your own there (read-only
# is fine). When none exists, the first start writes one with a single tenant `default` and a
# freshly generated key: the file keeps only the key's hash, and the key itself is printed once,
# on standard error (`docker logs`), as `ptc-server: generated API key: ptc_...`.
set -eu
TENANTS=${PTC_TENANTS:-/var/lib/ptc/tenants.toml}
if [ "${1:-}" = serve ] && [ ! -e "$TENANTS" ]; then
  case " $* " in
    *" --tenants $TENANTS "*)
      umask 077
      out=$(/opt/ptc/bin/ptc tenants hash-key)
      key=$(printf '%s\n' "$out" | sed -n 1p)
      hash=$(printf '%s\n' "$out" | sed -n 2p)
      printf '[[tenant]]\nid = "default"\nkeys = ["%s"]\n' "$hash" > "$TENANTS"
      echo "ptc-server: no tenants file at $TENANTS: wrote one with tenant 'default'" >&2
      echo "ptc-server: generated API key: $key" >&2
      ;;
  esac
fi
exec /opt/ptc/bin/ptc "$@"
