import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from precision_nb.engine.batches import (
    BatchesExhausted,
    BatchSource,
    batch_shape,
    output_to_loss,
    split_batch,
)


def test_callable_source_gets_the_index():
    src = BatchSource(lambda i: torch.full((2,), float(i)))
    assert src.get(7)[0].item() == 7.0


def test_dataloader_source_cycles_epochs():
    ds = TensorDataset(torch.arange(6.0).unsqueeze(1), torch.zeros(6, dtype=torch.long))
    src = BatchSource(DataLoader(ds, batch_size=3))
    firsts = [src.get(i)[0][0, 0].item() for i in range(4)]
    assert firsts == [0.0, 3.0, 0.0, 3.0]


def test_one_shot_iterator_runs_out():
    src = BatchSource(iter([torch.ones(2)]))
    src.get(0)
    with pytest.raises(BatchesExhausted):
        src.get(1)


@pytest.mark.parametrize("bad", [3, "abc", None, torch.ones(3), {"x": 1}])
def test_wrong_source_type_is_a_value_error(bad):
    with pytest.raises(ValueError, match="batches has type"):
        BatchSource(bad)


def test_empty_and_wrong_item_type():
    with pytest.raises(ValueError, match="empty"):
        BatchSource([]).get(0)
    with pytest.raises(ValueError, match="batch 0 has type str"):
        BatchSource(["a", "b"]).get(0)


def test_split_batch_forms():
    x, y = torch.ones(2, 3), torch.zeros(2)
    assert split_batch(x) == ((x,), {}, None)
    args, kwargs, labels = split_batch((x, y))
    assert args == (x,) and labels is y
    args, kwargs, labels = split_batch({"input_ids": x, "labels": y})
    assert args == () and list(kwargs) == ["input_ids"] and labels is y


class _TakesLabels(torch.nn.Module):
    """Computes its own loss when given labels, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, input_ids, labels=None):
        out = self.lin(input_ids).squeeze(-1)
        return {"logits": out, "loss": None if labels is None else F.mse_loss(out, labels)}


class _Wrapper(torch.nn.Module):
    """Like DistributedDataParallel: forward(*inputs, **kwargs) around ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


def test_labels_go_into_a_model_that_takes_them_unless_a_loss_fn_is_given():
    x, y = torch.ones(2, 3), torch.tensor([0.5, -1.0])
    batch = {"input_ids": x, "labels": y}
    model = _TakesLabels()
    for target in (model, _Wrapper(model)):
        args, kwargs, labels = split_batch(batch, target)
        assert args == () and kwargs == batch and labels is y
        loss, task = output_to_loss(target(*args, **kwargs), labels)
        assert task == "loss" and torch.equal(loss, F.mse_loss(model.lin(x).squeeze(-1), y))
    _, kwargs, labels = split_batch(batch, model, loss_fn=lambda o, t: o["logits"].sum())
    assert list(kwargs) == ["input_ids"] and labels is y
    _, kwargs, _ = split_batch(batch, torch.nn.Linear(3, 1))  # forward(input): no labels
    assert list(kwargs) == ["input_ids"]


def test_float_labels_beside_class_logits_ask_for_a_loss_fn():
    with pytest.raises(ValueError, match=r"float32 labels.*integer class labels; pass loss_fn"):
        output_to_loss(torch.randn(4, 1), torch.randn(4))


def test_tokens_come_from_token_id_inputs_whatever_the_task():
    ids = torch.zeros(4, 7, dtype=torch.long)
    assert batch_shape({"input_ids": ids, "labels": ids}).tokens == 28
    assert batch_shape((ids, torch.zeros(4, dtype=torch.long))).tokens == 28
    assert batch_shape((torch.zeros(4, 7), torch.zeros(4))).tokens is None  # float features
    assert (
        batch_shape((torch.zeros(4, 7), torch.zeros(4, 7, dtype=torch.long)), "causal_lm").tokens
        == 28
    )


def test_output_adapters():
    logits = torch.randn(4, 5)
    labels = torch.tensor([0, 1, 2, 3])
    loss, task = output_to_loss(logits, labels)
    assert task == "classification" and torch.allclose(loss, F.cross_entropy(logits, labels))
    scalar = torch.tensor(1.5)
    assert output_to_loss(scalar, None) == (scalar, "loss")
    assert output_to_loss({"loss": scalar, "logits": logits}, None)[0] is scalar

    class HFOutput:
        def __init__(self):
            self.loss = scalar
            self.logits = logits

    assert output_to_loss(HFOutput(), None)[0] is scalar


def test_causal_lm_shift_predicts_the_next_token():
    ids = torch.tensor([[1, 2, 3, 4]])
    # logits that put all mass on "the next token" give ~zero loss only with the shift
    logits = torch.full((1, 4, 6), -50.0)
    for t in range(3):
        logits[0, t, ids[0, t + 1]] = 50.0
    loss, task = output_to_loss(logits, ids)
    assert task == "causal_lm" and loss.item() < 1e-6
    logits_unshifted = torch.full((1, 4, 6), -50.0)
    for t in range(4):
        logits_unshifted[0, t, ids[0, t]] = 50.0
    assert output_to_loss(logits_unshifted, ids)[0].item() > 10


def test_output_errors_are_clear():
    with pytest.raises(ValueError, match="no labels"):
        output_to_loss(torch.randn(2, 3), None)
    with pytest.raises(ValueError, match="shape"):
        output_to_loss(torch.randn(2, 3, 4, 5), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="model output has type"):
        output_to_loss("text", None)


def test_custom_loss_fn_and_shape():
    out = torch.randn(3, 2)
    loss, task = output_to_loss(out, torch.zeros(3, 2), lambda o, y: ((o - y) ** 2).mean())
    assert task == "custom" and loss.dim() == 0
    shape = batch_shape((torch.zeros(4, 7, dtype=torch.long), torch.zeros(4, 7)), "causal_lm")
    assert shape.samples == 4 and shape.tokens == 28


class _UnhashableLoss:
    """A callable loss object with value equality (so unhashable, like many dataclasses)."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _UnhashableLoss)

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        return out.sum()


def test_loss_fn_arity_is_read_for_one_and_two_argument_callables():
    out, y = torch.ones(2, 2), torch.zeros(2, 2)
    # one argument: called with the output only; two: with output and labels (each call the same)
    for _ in range(2):
        assert output_to_loss(out, y, lambda o: o.sum() * 0 + 7)[0].item() == 7
        assert output_to_loss(out, y, lambda o, t: (o - t).sum())[0].item() == 4
    loss, task = output_to_loss(out, y, _UnhashableLoss())
    assert task == "custom" and loss.item() == 4


def test_to_device_keeps_tensors_already_there_and_the_batch_type():
    from collections import namedtuple

    from precision_nb.engine.batches import to_device

    Pair = namedtuple("Pair", "x y")
    x, y = torch.randn(2, 3), torch.tensor([0, 1])
    cpu = torch.device("cpu")
    moved = to_device(Pair(x, y), cpu)
    assert type(moved) is Pair and moved.x is x and moved.y is y
    assert to_device([x, y], cpu)[0] is x
    as_half = to_device((x, {"labels": y}), torch.device("meta"))
    assert as_half[0].device.type == "meta" and as_half[1]["labels"].device.type == "meta"
