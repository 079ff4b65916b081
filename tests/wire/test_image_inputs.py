"""image_url content parts (data URLs) through both request parsers, and the Qwen2.5-VL image
placeholders widened after the chat template (wire/images.py, models/tokenizer/chat_template.py)."""

from __future__ import annotations

import base64
import hashlib
import io

import numpy as np
import pytest

from openclaw_jax.gateway.protocol import GatewayHTTPError, parse_agent_chat_request
from openclaw_jax.inference.protocol import parse_chat_request
from openclaw_jax.models.image_processing import ImageProcessorConfig, image_token_count, process_image
from openclaw_jax.models.tokenizer.chat_template import TokenizerError, expand_image_placeholders
from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.images import IMAGE_PLACEHOLDER, extract_images


def png_bytes(h: int = 30, w: int = 40, seed: int = 0) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, fmt: str = "png") -> str:
    return f"data:image/{fmt};base64," + base64.b64encode(data).decode()


def image_message(url: str, text: str = "What is on the screen?") -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": text}]}


def test_gateway_parses_data_url_images_in_prompt_order():
    a, b = png_bytes(seed=1), png_bytes(seed=2)
    body = {"messages": [{"role": "system", "content": "be brief"}, image_message(data_url(a)),
                         {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": [{"type": "text", "text": "and now "},
                                                      {"type": "image_url", "image_url": {"url": data_url(b),
                                                                                          "detail": "high"}}]}]}
    req = parse_agent_chat_request(body)
    assert [im.data for im in req.images] == [a, b]
    assert req.images[0].sha256 == hashlib.sha256(a).hexdigest() and req.images[0].mime == "image/png"
    # Qwen2.5-VL's template form: parts joined with nothing, the image where its part was.
    assert req.messages[1]["content"] == IMAGE_PLACEHOLDER + "What is on the screen?"
    assert req.messages[3]["content"] == "and now " + IMAGE_PLACEHOLDER
    assert req.messages[0]["content"] == "be brief"
    # Text-only requests are unchanged.
    assert parse_agent_chat_request({"messages": [{"role": "user", "content": "hi"}]}).images == ()


@pytest.mark.parametrize("url, needle", [
    ("https://example.com/cat.png", "remote image URLs are not fetched"),
    ("http://127.0.0.1/x.png", "remote image URLs are not fetched"),
    ("data:image/png;base64,@@notbase64@@", "not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"GIF89a-not-a-png").decode(), "not a PNG image"),
    ("data:text/plain;base64,aGVsbG8=", "must be a data URL"),
    ("data:image/png;base64,", "empty"),
])
def test_gateway_refuses_remote_and_bad_image_data_naming_the_field(url, needle):
    body = {"messages": [{"role": "user", "content": "hi"}, image_message(url)]}
    with pytest.raises(GatewayHTTPError) as info:
        parse_agent_chat_request(body)
    err = info.value
    assert err.status == 400 and needle in err.message
    assert err.body()["error"]["param"] == "messages[1].content[0].image_url.url"


def test_gateway_refuses_images_outside_user_turns():
    body = {"messages": [{"role": "assistant", "content": [{"type": "image_url",
                                                             "image_url": {"url": data_url(png_bytes())}}]}]}
    with pytest.raises(GatewayHTTPError) as info:
        parse_agent_chat_request(body)
    assert info.value.status == 400 and "user" in info.value.message


def test_inference_server_parses_the_same_images_and_errors():
    a = png_bytes(seed=3)
    req = parse_chat_request({"messages": [image_message(data_url(a), "describe")]}, vocab_size=100)
    assert [im.sha256 for im in req.images] == [hashlib.sha256(a).hexdigest()]
    assert req.messages[0]["content"] == IMAGE_PLACEHOLDER + "describe"
    with pytest.raises(WireError) as info:
        parse_chat_request({"messages": [image_message("https://x/y.png")]}, vocab_size=100)
    assert info.value.status == 400 and info.value.param == "messages[0].content[0].image_url.url"


def test_placeholders_widen_to_the_image_token_count_of_each_grid():
    cfg = ImageProcessorConfig()
    a, b = png_bytes(56, 84, 1), png_bytes(112, 168, 2)
    counts = [image_token_count(process_image(x, cfg)[1], cfg.merge_size) for x in (a, b)]
    assert counts[0] != counts[1]
    _, images = extract_images([image_message(data_url(a)), image_message(data_url(b))])
    text = f"<|im_start|>user\n{IMAGE_PLACEHOLDER}x<|im_end|>\n<|im_start|>user\n{IMAGE_PLACEHOLDER}y<|im_end|>\n"
    out = expand_image_placeholders(text, counts)
    first, second = out.split("x<|im_end|>")
    assert first.count("<|image_pad|>") == counts[0] and second.count("<|image_pad|>") == counts[1]
    assert first.endswith("<|vision_start|>" + "<|image_pad|>" * counts[0] + "<|vision_end|>")
    assert len(images) == 2


def test_placeholder_count_must_match_the_images():
    with pytest.raises(TokenizerError, match="may not spell the image markers"):
        expand_image_placeholders(f"{IMAGE_PLACEHOLDER} and a typed <|image_pad|>", [4])
    with pytest.raises(TokenizerError):
        expand_image_placeholders("no image here", [4])
    assert expand_image_placeholders("plain", []) == "plain"


def test_generate_image_data_round_trips_and_is_checked():
    from openclaw_jax.wire.images import image_data_url
    from openclaw_jax.wire.sglang import generate_request_body, parse_generate_request

    a = png_bytes(seed=4)
    _, (image,) = extract_images([image_message(data_url(a))])
    body = generate_request_body(input_ids=[1, 2, 3], image_data=[image_data_url(image)])
    req = parse_generate_request(body, vocab_size=100)
    assert [im.data for im in req.items[0].images] == [a]
    assert parse_generate_request({"input_ids": [1, 2]}, vocab_size=100).items[0].images == ()
    with pytest.raises(WireError) as info:
        parse_generate_request({"input_ids": [1, 2], "image_data": ["https://x/y.png"]}, vocab_size=100)
    assert info.value.param == "image_data[0]" and "remote" in info.value.message
    with pytest.raises(WireError, match="single prompt"):
        parse_generate_request({"input_ids": [[1], [2]], "image_data": [data_url(a)]}, vocab_size=100)


def test_processor_for_a_vl_model_dir(tmp_path):
    import json

    from openclaw_jax.models.image_processing import processor_for_model_dir

    assert processor_for_model_dir(tmp_path) is None and processor_for_model_dir("tiny") is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert processor_for_model_dir(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {
        "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 12845056}))
    proc = processor_for_model_dir(tmp_path)
    assert (proc.patch_size, proc.merge_size, proc.min_pixels, proc.max_pixels) == (16, 2, 3136, 12845056)
    # the shipped Qwen2.5-VL-7B config.json
    from pathlib import Path

    shipped = processor_for_model_dir(Path(__file__).resolve().parents[2] / "configs/models/qwen2.5-vl-7b-instruct")
    assert shipped is not None and shipped.patch_size == 14 and shipped.merge_size == 2
