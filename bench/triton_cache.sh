# Triton's cache carried between GPU machines in parts, for the side-by-side scripts (sourced).
#
# FLA autotunes its Triton kernels on first use, minutes a shape; a machine lent for one call starts
# with an empty cache. So the scripts restore the cache from parts kept in the git-ignored
# .gpu-bench/ (NAME.tgz.00, .01, ...) and, when a run compiled new kernels, write the grown cache
# as parts of 15 MiB into the results folder (the device tool hands back files under 16 MiB) to be
# copied into .gpu-bench/. Only what a cache hit reads goes into the parts: the cubins and the json
# (metadata, groups, autotuning results); Triton's loader skips a group's missing intermediate
# files (ptx, llir, ttir, ttgir, source), as with TRITON_STORE_BINARY_ONLY.
#
#   triton_cache_restore NAME          unpacks .gpu-bench/NAME.tgz.* into $TRITON_CACHE_DIR
#   triton_cache_save NAME OUTDIR      writes OUTDIR/NAME.tgz.NN if kernels were added since restore

triton_cache_kernels() { find "$TRITON_CACHE_DIR" -name '*.cubin' 2>/dev/null | wc -l; }

triton_cache_restore() {
    mkdir -p "$TRITON_CACHE_DIR"
    if ls .gpu-bench/"$1".tgz.* >/dev/null 2>&1; then
        cat .gpu-bench/"$1".tgz.* | tar -xz -C "$TRITON_CACHE_DIR" && echo "Triton cache restored from .gpu-bench/$1.tgz.*"
    fi
    TRITON_CACHE_KERNELS_BEFORE=$(triton_cache_kernels)
}

triton_cache_save() {
    local after
    after=$(triton_cache_kernels)
    [ "$after" != "${TRITON_CACHE_KERNELS_BEFORE:-0}" ] || return 0
    find "$TRITON_CACHE_DIR" -type f \( -name '*.llir' -o -name '*.ptx' -o -name '*.ttir' -o -name '*.ttgir' \
        -o -name '*.source' \) -delete
    tar -cz -C "$TRITON_CACHE_DIR" . 2>/dev/null | split -b 15m -d - "$2/$1.tgz."
    echo "Triton cache: ${TRITON_CACHE_KERNELS_BEFORE:-0} -> $after kernels; copy $2/$1.tgz.* into .gpu-bench/"
}
