{
  "argv": [
    "/work/main/.harness/fork/build-linux-x86_64-cuda/bin/llama-completion",
    "-m",
    "/work/main/.harness/cache/models/moe-llama-8L-32x2048x1536-F16-d32cda4d811d2fa1.gguf",
    "-f",
    "results/gpu1-20261206T131511Z/linux-x86_64-cuda/cuda-nopin-pin-layers/gen/moe-large/long-prefill.r2.prompt",
    "-n",
    "120",
    "-c",
    "1024",
    "--seed",
    "42",
    "--temp",
    "0",
    "-no-cnv",
    "--no-display-prompt",
    "--no-escape",
    "--simple-io",
    "--color",
    "off",
    "--no-warmup",
    "-fit",
    "off",
    "-lv",
    "4",
    "--load-mode",
    "none",
    "--cpu-moe",
    "-ngl",
    "99"
  ],
  "env": {
    "GGML_CUDA_NO_PINNED": "1",
    "GGML_CUDA_MOE_PIN_LAYERS": "4"
  },
  "launcher_env": {},
  "timeout_s": 300
}
