"""Multi-LoRA: adapter requests (`request.LoRARequest`), PEFT adapter loading
(`peft_loader.load_peft_adapter`), the model-side slots (`layers.add_lora`, `write_adapter`,
`clear_slot`) and the engine's bounds (`config.LoRAConfig`)."""
