"""Images in chat messages: decoding with bounds (decode.py), tool / env values as content parts
(content.py), and rendering through a vision model's chat template and image processor (processor.py).

  parts = to_content_parts([text, pil_image], field="tool 'screenshot'")   # [{"type": "text"...}, {"type": "image"...}]
  vision = VisionProcessor()                                                  # HF's Qwen2-VL image processor
  enc = vision.encode(tokenizer, messages, add_generation_prompt=True)       # ids, pixel_values, image_grid_thw
"""
