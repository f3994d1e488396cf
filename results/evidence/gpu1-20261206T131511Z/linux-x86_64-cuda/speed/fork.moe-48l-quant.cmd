{
  "argv": [
    "/work/main/.harness/fork/build-linux-x86_64-cuda/bin/llama-harness-engine",
    "-m",
    "/work/main/.harness/cache/models/derived/moe-48l-quant-Q4_K_M-3897cd0065039109.gguf",
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
    "4"
  ],
  "env": {},
  "timeout_s": 300
}
