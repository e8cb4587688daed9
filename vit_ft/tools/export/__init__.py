"""vit-ft export and push: ONNX / int8 (`onnx`), the Hub push (`hub`) and which format it uses (`hub_format`)."""
