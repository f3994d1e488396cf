{
  "argv": [
    "/work/main/.harness/forecast/e3546c7948e3/old-base/build-linux-x86_64-cpu/bin/llama-harness-engine",
    "-m",
    "/root/.cache/llama-fork-harness/models/gemma-3-270m-q4_k_m.gguf",
    "-n",
    "120",
    "-c",
    "1024",
    "--seed",
    "42",
    "--temp",
    "0",
    "--no-warmup",
    "-lv",
    "4"
  ],
  "env": {},
  "timeout_s": 300
}
