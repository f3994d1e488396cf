{
  "argv": [
    "/work/main/.harness/fork/build-linux-x86_64-cuda/bin/llama-harness-engine",
    "-m",
    "/work/main/.harness/cache/models/moe-llama-8L-32x2048x1536-F16-d32cda4d811d2fa1.gguf",
    "-n",
    "120",
    "-c",
    "1024",
    "--seed",
    "42",
    "--temp",
    "0",
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
    "GGML_CUDA_PIN_SIM_CALL_MAX_MB": "512",
    "GGML_CUDA_PIN_SIM_TOTAL_MAX_MB": "2048"
  },
  "timeout_s": 300
}
