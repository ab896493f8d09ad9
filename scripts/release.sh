#!/usr/bin/env bash
# Build a release tarball: retie-VERSION-x86_64-linux.tar.gz in target/dist/.
#
#   bin/retie                 the CLI and the sandbox runtime (static, musl)
#   bin/retie-agent           the agent's commands (retie execs it, ADR 0412)
#   bin/retie-sandbox-helper  the small helper the agent starts sandboxes through
#   share/man/man1/retie.1    and one page per subcommand (retie-sandbox-exec.1, ...)
#   share/bash-completion/completions/retie
#   share/zsh/site-functions/_retie
#   share/fish/vendor_completions.d/retie.fish
#   share/doc/retie/          README.md, LICENSE (when present)
#
# Unpack it as a prefix: `tar -xzf retie-*.tar.gz -C ~/.local --strip-components=1`
# or into /usr/local with sudo. The man pages and completions are generated
# from the binary's own clap definition (`retie __generate`), so they match it.
# Needs what scripts/setup installs (the musl target and musl-gcc).
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-musl
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
if [ -z "$version" ]; then
    echo "release: no version in Cargo.toml" >&2
    exit 1
fi
name="retie-${version}-x86_64-linux"
dist=target/dist
stage="$dist/$name"

# One build of the default members (retie and the runtime): all three
# binaries with one feature resolution (building the helper's package
# alone would resolve its dependencies' features anew and rebuild them).
cargo build --release --locked --target "$target"

rm -rf "$stage" "$dist/$name.tar.gz"
mkdir -p "$stage/bin" "$stage/share/man/man1" "$stage/share/bash-completion/completions" \
    "$stage/share/zsh/site-functions" "$stage/share/fish/vendor_completions.d" \
    "$stage/share/doc/retie"
for b in retie retie-agent retie-sandbox-helper; do
    install -m 0755 "target/$target/release/$b" "$stage/bin/$b"
    # Static: no program interpreter (the dynamic loader) may be named.
    if readelf -l "$stage/bin/$b" 2>/dev/null | grep -q 'Requesting program interpreter'; then
        echo "release: $b is not static" >&2
        exit 1
    fi
done

gen="$(mktemp -d)"
trap 'rm -rf "$gen"' EXIT
"$stage/bin/retie" __generate man "$stage/share/man/man1" >/dev/null
for shell in bash zsh fish; do
    "$stage/bin/retie" __generate completions "$shell" "$gen" >/dev/null
done
install -m 0644 "$gen/retie.bash" "$stage/share/bash-completion/completions/retie"
install -m 0644 "$gen/_retie" "$stage/share/zsh/site-functions/_retie"
install -m 0644 "$gen/retie.fish" "$stage/share/fish/vendor_completions.d/retie.fish"
bash -n "$stage/share/bash-completion/completions/retie"
for f in README.md LICENSE; do
    if [ -f "$f" ]; then install -m 0644 "$f" "$stage/share/doc/retie/$f"; fi
done

# Reproducible-ish: sorted names, fixed owner, the last commit's time.
mtime="@$(git log -1 --format=%ct 2>/dev/null || date +%s)"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$mtime" \
    -C "$dist" -czf "$dist/$name.tar.gz" "$name"
size=$(stat -c %s "$dist/$name.tar.gz")
sum=$(sha256sum "$dist/$name.tar.gz" | cut -d' ' -f1)
echo "$dist/$name.tar.gz: $size bytes, sha256 $sum"
