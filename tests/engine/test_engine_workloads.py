import pytest
import torch

from precision_nb.engine.workloads import PRESETS, WORKLOADS, get_workload, load_corpus


@pytest.mark.parametrize("name", ["mlp", "transformer", "lm", "cnn"])
def test_tiny_workloads_build_and_forward(name):
    wl = get_workload(name, "tiny")
    model = wl.make_model()
    batch = wl.make_batches("cpu")(0)
    out = model(batch[0])
    assert out.shape[0] == wl.info["batch_size"] == batch[0].shape[0]
    assert wl.info["name"] in WORKLOADS and wl.info["preset"] == "tiny"
    if wl.info["task"] == "causal_lm":
        assert out.shape[-1] == wl.info["dims"]["vocab"]
        assert torch.equal(batch[0], batch[1])  # labels are the ids; the loss shifts them
    else:
        assert int(batch[1].max()) < out.shape[-1]


def test_batches_are_deterministic_per_seed_and_cycle():
    a = get_workload("mlp", "tiny", seed=3).make_batches("cpu")
    b = get_workload("mlp", "tiny", seed=3).make_batches("cpu")
    c = get_workload("mlp", "tiny", seed=4).make_batches("cpu")
    assert torch.equal(a(5)[0], b(5)[0])
    assert not torch.equal(a(5)[0], c(5)[0])
    assert not torch.equal(a(0)[0], a(1)[0])
    assert torch.equal(a(0)[0], a(8)[0])  # a fixed pool of 8 batches


def test_presets_grow():
    sizes = []
    for preset in PRESETS:
        wl = get_workload("transformer", preset)
        sizes.append(wl.info["dims"]["d_model"] * wl.info["dims"]["layers"])
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


def test_corpus_is_shipped_text_and_char_vocab_matches():
    text = load_corpus()
    assert 2000 < len(text) < 20000
    wl = get_workload("lm", "tiny")
    assert wl.info["dims"]["vocab"] == len(set(text))
    syn = get_workload("lm", "tiny", data="synthetic")
    assert syn.info["dims"]["vocab"] == 512


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="known: mlp, transformer, cnn, lm"):
        get_workload("resnet")
    with pytest.raises(ValueError, match="tiny, small, medium, large"):
        get_workload("mlp", "huge")
    with pytest.raises(ValueError, match="corpus, synthetic"):
        get_workload("lm", "tiny", data="wiki")
