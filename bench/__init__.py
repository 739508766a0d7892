"""Benchmarks with vLLM's own load generator (`vllm bench serve`) against any OpenAI endpoint."""
