# What the scripts for a bare device machine share (gpu-bringup-night.sh, gpu-curve-point.sh): sourced, not run.
#
# mamba-ssm's autotune picks (Triton's *.autotune.json files) are kept from call to call as a runner keeps its
# caches from night to night: on a bare machine every new key re-times all of mamba-ssm's configs, in the
# tuner's precision checks and in every bench.
MAMBA_SSM_PICKS=.gpu/state/mamba-ssm-autotune-picks.tgz

restore_mamba_ssm_picks() {  # the picks a restored state brought, into Triton's caches
  if [[ -f $MAMBA_SSM_PICKS ]]; then tar xzPf "$MAMBA_SSM_PICKS" || exit 2; fi
}

save_mamba_ssm_picks() {  # this call's picks, into the tarball $1
  find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" /tmp/torchinductor_* -name '*.autotune.json' -print0 2>/dev/null \
    | tar czPf "$1" --null -T -
}

gpu_slug() {  # the config-file slug of this machine's GPU
  python3 -c 'from mamba2_guard.adapters import fingerprint as f; print(f.gpu_slug(f.collect()))'
}

print_machine() {  # the card and the software every number is recorded with
  nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
  python3 -c 'from importlib.metadata import version as v; print(*(f"{p} {v(p)}" for p in ("torch", "triton", "helion", "mamba-ssm")))'
}
