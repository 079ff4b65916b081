"""Probes: images built to make a server decode without bound, answer 500, or keep junk.

Real processes on 127.0.0.1: `python -m openclaw_jax.inference` serving a tiny random Qwen2.5-VL
checkpoint that `transformers` made, and `python -m openclaw_jax.gateway` in front of it. Each bad
image gets a 4xx JSON error from both: a 13,000 x 13,000 PNG of 20 KB (it would decode to 507 MB of
RGB), a PNG with 5 MiB after its end (a decoder ignores them; a server would keep them), a corrupt
PNG, 33 images, a remote URL. The resident memory of each server rises by less than 64 MiB over a
probe (its peak, VmHWM, reset before it), and the health checks keep answering within 1 s.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import requests

from tests.helpers.abuse import (GatewayProcess, assert_responsive, bomb_png, data_url, health_latencies_during,
                    peak_rss_growth_mib)
from tests.helpers.server_utils import ServerProcess
from tests.e2e.test_image_e2e import make_checkpoint
from tests.e2e.test_image_pipeline import tokenizer
from tests.trainer.test_vlm_train_step import png

BOMB = bomb_png(13_000)
MAX_GROWTH_MIB = 64


def corrupt_png() -> bytes:
    """A PNG whose structure is whole (IHDR, IDAT, IEND, right CRCs) but whose IDAT is not zlib data."""
    good = png(3)
    ihdr = good[8:33]

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return good[:8] + ihdr + chunk(b"IDAT", b"this is not zlib data" * 8) + chunk(b"IEND", b"")


BAD_IMAGES = {   # name -> (data URL, what the error must say)
    "13000x13000": (data_url(BOMB), "169000000 pixels"),
    "trailing 5 MiB": (data_url(png(4) + bytes(5 << 20)), "bytes follow the end of the PNG"),
    "remote": ("https://example.com/cat.png", "remote image URLs are not fetched"),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abuse_images")
    ckpt = tmp / "qwen25vl"
    make_checkpoint(ckpt)
    tokenizer().save_pretrained(ckpt)
    server = ServerProcess(ckpt, log_path=tmp / "server.log").start()
    gateway = GatewayProcess(["--policy-url", server.url, "--judge", "rule", "--model", str(ckpt), "--store",
                              str(tmp / "store"), "--set", "default_max_tokens=4"], tmp / "gateway.log")
    yield server, gateway
    gateway.stop()
    server.kill()


def chat_with_images(url: str, *image_urls: str) -> requests.Response:
    content = [{"type": "text", "text": "What is on it?"}] + [{"type": "image_url", "image_url": {"url": u}}
                                                             for u in image_urls]
    return requests.post(url + "/v1/chat/completions", timeout=120, headers={"Content-Type": "application/json"},
                         data=json.dumps({"messages": [{"role": "user", "content": content}]}))


def generate_with_images(url: str, *image_urls: str) -> requests.Response:
    ids = [5, 320, *([322] * 6), 321, 6]   # one image's placeholders are checked only after it is measured
    return requests.post(url + "/generate", timeout=120, headers={"Content-Type": "application/json"},
                         data=json.dumps({"input_ids": ids, "image_data": list(image_urls),
                                          "sampling_params": {"max_new_tokens": 2}}))


def error_message(r: requests.Response) -> str:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    body = r.json()
    return body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("message", "")


def test_a_good_image_is_served_through_the_gateway(servers):
    _, gateway = servers
    r = chat_with_images(gateway.url, data_url(png(5)))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant", r.text


@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_bad_images_get_4xx_from_both_servers_without_memory_growth(servers, name):
    server, gateway = servers
    url, needle = BAD_IMAGES[name]
    for what, proc, send, health in (("gateway", gateway.proc, lambda: chat_with_images(gateway.url, url),
                                      gateway.url + "/healthz"),
                                     ("model server", server.proc, lambda: generate_with_images(server.url, url),
                                      server.url + "/health")):
        (replies, worst), growth = peak_rss_growth_mib(proc.pid, lambda: health_latencies_during(send, health))
        print(f"\n{what}, {name}: peak RSS growth {growth:.1f} MiB")
        assert growth < MAX_GROWTH_MIB, (what, name, growth)
        assert_responsive(worst, f"{what} with a {name} image")
        for r in replies:
            assert needle in error_message(r), (what, r.text[:300])


def test_a_corrupt_image_is_a_4xx_from_both_servers(servers):
    server, gateway = servers
    url = data_url(corrupt_png())
    assert "cannot" in error_message(generate_with_images(server.url, url))
    assert "cannot" in error_message(chat_with_images(gateway.url, url))   # the policy server's 400, passed on


def test_too_many_images_are_refused_before_decoding(servers):
    server, gateway = servers
    urls = [data_url(png(6))] * 33
    assert "at most 32 images" in error_message(generate_with_images(server.url, *urls))
    assert "at most 32 images" in error_message(chat_with_images(gateway.url, *urls))
    # the model server's chat route does not serve images: the bomb is measured and refused all the same
    r = requests.post(server.url + "/v1/chat/completions", timeout=60, json={"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(BOMB)}}]}]})
    assert r.status_code == 400 and "169000000 pixels" in r.text, r.text[:300]
