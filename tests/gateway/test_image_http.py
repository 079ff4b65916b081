"""Images at the real gateway over HTTP (a real `openai` client): a remote image URL or bad data is a
400 naming the field; a gateway without an image processor (a text policy) refuses a well-formed
image with a 400 (nothing is sent to the policy, no turn is recorded)."""

from __future__ import annotations

import base64

import openai
import pytest

from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from tests.helpers.scripted_pool import LoopThread
from tests.gateway.test_gateway import Env
from tests.wire.test_image_inputs import png_bytes


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    lt = LoopThread()
    e = Env(lt, tiny_test_tokenizer(), tmp_path_factory.mktemp("gw"))
    yield e
    e.close()
    lt.stop()


def image_messages(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.mark.parametrize("url, needle", [
    ("https://example.com/x.png", "remote image URLs are not fetched"),
    ("data:image/png;base64,!!!", "not valid base64"),
    ("data:image/jpeg;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nxx").decode(), "not a JPEG image"),
])
def test_bad_images_are_400_naming_the_field(env, url, needle):
    with pytest.raises(openai.BadRequestError) as info:
        env.chat(image_messages(url), session="s-bad", max_tokens=2)
    body = info.value.body
    assert needle in body["message"] and body["param"] == "messages[0].content[1].image_url.url"


def test_a_good_image_is_refused_by_a_text_only_gateway(env):
    url = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    before = env.gateway.stats.turns_recorded
    with pytest.raises(openai.BadRequestError) as info:
        env.chat(image_messages(url), session="s-good", max_tokens=2)
    assert "reads text only" in info.value.body["message"] and info.value.body["param"] == "messages"
    assert env.gateway.stats.turns_recorded == before
    # the same request without the image is served
    reply = env.chat([{"role": "user", "content": "what is this?"}], session="s-text", max_tokens=2)
    assert reply.choices[0].message is not None
