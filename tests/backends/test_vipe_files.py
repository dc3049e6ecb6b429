"""ViPE's start-up check names every file its ``lyra`` pipeline opens, BERT's as GroundingDINO loads them."""

from __future__ import annotations

import pytest

from tasks.backends.vipe_files import check_files, needed_files
from tasks.errors import ModelLoadError
from tests.backends.standin_env import LYRA


def test_a_cache_with_only_berts_config_names_its_vocabulary_and_weights(tmp_path):
    # groundingdino/util/get_tokenlizer.py:19-27: AutoTokenizer reads vocab.txt, BertModel model.safetensors.
    for needed in needed_files(LYRA):
        if "bert-base-uncased" in needed.path and not needed.path.endswith("config.json"):
            continue
        f = tmp_path / needed.path.replace("*", "0" * 40)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    with pytest.raises(ModelLoadError) as caught:
        check_files(LYRA, tmp_path, "fill it")
    message = str(caught.value)
    assert "lacks 2 file(s)" in message
    assert "models--bert-base-uncased/snapshots/*/vocab.txt" in message
    assert "models--bert-base-uncased/snapshots/*/model.safetensors" in message
