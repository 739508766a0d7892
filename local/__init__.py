"""Running serve_app for real on a CPU: a tiny generated model, a local Ray, the vLLM CPU build."""
