{
  "argv": [
    "/work/main/.harness/fork/build-linux-x86_64-cuda/bin/llama-completion",
    "-m",
    "/work/main/.harness/cache/models/derived/moe-48l-quant-Q4_K_M-d63c38566e83f087.gguf",
    "-f",
    "results/gpu1-20261202T171424Z/linux-x86_64-cuda/cuda-pin-layers-48/gen/moe-48l-quant/long-prefill.r2.prompt",
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
    "GGML_CUDA_MOE_PIN_LAYERS": "48"
  },
  "launcher_env": {},
  "timeout_s": 300
}
