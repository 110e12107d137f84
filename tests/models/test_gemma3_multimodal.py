"""A `Gemma3ForConditionalGeneration` checkpoint (Gemma 3 4B and up) runs as its text model:
the language model's tensors (saved under `language_model.model.`) fill vjx's Gemma 3, the
vision tower and projector are skipped, and the logits of a text prompt equal transformers'
multimodal model's. The engine reads its sizes from the nested `text_config`."""

import numpy as np
import pytest
import torch
import transformers

from tests.helpers.families import MAX_MODEL_LEN, VOCAB, family_config
from tests.helpers.model_steps import empty_caches, prefill, random_blocks
from tests.helpers.tiny_llama import randomize_
from tests.helpers.tokenizer import make_tokenizer
from vjx.attention.reference import ReferenceBackend
from vjx.config import ModelConfig
from vjx.engine_args import EngineArgs
from vjx.models.loader import get_model


def _multimodal_config() -> transformers.Gemma3Config:
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    text = family_config("gemma3")
    config = transformers.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        boi_token_index=3,
        eoi_token_index=4,
        image_token_index=5,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3-mm")
    torch.manual_seed(0)
    hf_model = transformers.Gemma3ForConditionalGeneration(_multimodal_config()).eval()
    hf_model.config.text_config._attn_implementation = "eager"
    randomize_(hf_model.model.language_model, 0)
    hf_model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path, hf_model


def test_text_logits_match_the_multimodal_model(checkpoint):
    path, hf_model = checkpoint
    hf_config = transformers.AutoConfig.from_pretrained(path)
    model_config = ModelConfig(
        model=str(path),
        tokenizer=str(path),
        hf_config=hf_config,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        load_format="auto",
    )
    model = get_model(model_config, ReferenceBackend())
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    token_ids = np.random.default_rng(1).integers(6, VOCAB, 70)
    logits, _ = prefill(model, token_ids, 0, random_blocks(1), empty_caches(model_config.hf_text_config))
    with torch.no_grad():
        expected = hf_model(input_ids=torch.as_tensor(token_ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_the_engine_reads_the_text_config(checkpoint):
    path, _ = checkpoint
    config = EngineArgs(model=str(path), tensor_parallel_size=4).create_engine_config()
    text = config.model_config.hf_text_config
    assert type(text).__name__ == "Gemma3TextConfig"
    assert config.model_config.max_model_len == text.max_position_embeddings == MAX_MODEL_LEN
