#!/usr/bin/env bash
# On this machine: packs NVIDIA/cuda-samples' Samples/0-6 and Common (their
# sources and data; no documents, images of the docs or project files) from
# a clone into .carry/upstream.tar.xz (~31 MB), for scripts/gpu/upstream.sh
# to carry to the GPU machine.
# usage: scripts/gpu/pack-upstream.sh GIT_DIR [COMMIT]
set -euo pipefail
git_dir=$1; commit=${2:-HEAD}
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git --git-dir="$git_dir" ls-tree -r -l "$commit" | awk -F'\t' '{
    split($1, b, " ");
    if ($2 ~ /^(Samples\/[0-6]_|Common\/)/ && b[4] != "-" && b[4] < 8000000 &&
        $2 !~ /\/doc\// && $2 !~ /\.(doc|docx|pdf|sln|vcxproj|vcxproj\.filters|png|jpg)$/)
        print b[3] "\t" $2 }' |
while IFS=$'\t' read -r blob path; do
    mkdir -p "$tmp/$(dirname "$path")"
    git --git-dir="$git_dir" cat-file blob "$blob" > "$tmp/$path"
done
mkdir -p .carry
echo "$(git --git-dir="$git_dir" rev-parse "$commit")" > "$tmp/COMMIT"
tar cJf .carry/upstream.tar.xz -C "$tmp" .
ls -la .carry/upstream.tar.xz
