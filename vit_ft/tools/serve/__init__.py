"""`vit-ft serve`: a batched inference server on LitServe (payload, runtime, api, server)."""
