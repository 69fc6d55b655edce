"""The demo's procedural generator: shapes, dtypes, determinism, plausibility."""

import itertools

import numpy as np
import pytest

from wirehead_torch.apps.synth import synth_generator, synth_sample


@pytest.mark.parametrize("size,n_labels", [(32, 8), (17, 5), (24, 2), (20, 3), (16, 40)])
def test_shapes_dtypes_ranges(size, n_labels):
    image, labels = synth_sample(np.random.default_rng(0), size=size, n_labels=n_labels)
    assert image.shape == labels.shape == (size, size, size)
    assert image.dtype == np.float32
    assert labels.dtype == np.uint8
    assert image.flags.c_contiguous and labels.flags.c_contiguous
    assert np.isfinite(image).all()
    assert image.min() == 0.0 and image.max() == 1.0
    assert labels.min() == 0 and labels.max() < n_labels
    # Background surrounds the head: every corner voxel is label 0.
    for c in itertools.product((0, size - 1), repeat=3):
        assert labels[c] == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64, np.uint16])
def test_label_dtype(dtype):
    image, labels = synth_sample(np.random.default_rng(1), size=16, n_labels=6, label_dtype=dtype)
    assert labels.dtype == np.dtype(dtype)
    assert image.dtype == np.float32


def test_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="integer"):
        synth_sample(rng, size=16, label_dtype=np.float32)
    with pytest.raises(ValueError, match="fit"):
        synth_sample(rng, size=16, n_labels=300, label_dtype=np.uint8)
    with pytest.raises(ValueError, match="n_labels"):
        synth_sample(rng, size=16, n_labels=1)
    with pytest.raises(ValueError, match="size"):
        synth_sample(rng, size=2)
    with pytest.raises(ValueError, match="fit"):
        # Checked when the generator is created, not at the first next().
        synth_generator(n_labels=1000, label_dtype=np.uint8)


def test_generator_is_deterministic_with_seed():
    a = list(itertools.islice(synth_generator(size=16, seed=42), 3))
    b = list(itertools.islice(synth_generator(size=16, seed=42), 3))
    c = list(itertools.islice(synth_generator(size=16, seed=43), 3))
    for (ia, la), (ib, lb) in zip(a, b):
        assert np.array_equal(ia, ib) and np.array_equal(la, lb)
    # Different seeds, and successive samples of one stream, differ.
    assert not np.array_equal(a[0][1], c[0][1])
    assert not np.array_equal(a[0][1], a[1][1])
    assert not np.array_equal(a[0][0], a[1][0])


def test_sample_accepts_seed_or_generator():
    i1, l1 = synth_sample(7, size=16)
    i2, l2 = synth_sample(np.random.default_rng(7), size=16)
    assert np.array_equal(i1, i2) and np.array_equal(l1, l2)


def test_all_labels_present_and_spatially_coherent():
    rng = np.random.default_rng(3)
    for _ in range(5):
        _, labels = synth_sample(rng, size=32, n_labels=8)
        counts = np.bincount(labels.ravel(), minlength=8)
        # Head takes a real share of the volume, and several tissue classes show.
        assert 0.2 < 1 - counts[0] / labels.size < 0.8
        assert (counts[2:] > 0).sum() >= 3
        # Blobby regions: along each axis, most neighbours share a label.
        # (Independent per-voxel labels would give about 1/6 inside the head;
        # this generator gives about 0.86, never below 0.8 in 600 draws.)
        for axis in range(3):
            a = np.moveaxis(labels, axis, 0)
            inside = (a[1:] > 1) & (a[:-1] > 1)
            same = (a[1:] == a[:-1])[inside].mean()
            assert same > 0.75, (axis, same)


def test_intensity_depends_on_label():
    rng = np.random.default_rng(5)
    for _ in range(5):
        image, labels = synth_sample(rng, size=32, n_labels=8)
        present = [l for l in range(8) if (labels == l).sum() >= 50]
        means = np.array([image[labels == l].mean() for l in present])
        within = np.mean([image[labels == l].std() for l in present])
        # Class means are spread out compared to the spread inside a class,
        # so a classifier can learn labels from intensity (plus context).
        assert means.std() > within
        # Background is the darkest class.
        assert means[0] == means.min()


def test_samples_vary_between_draws():
    rng = np.random.default_rng(9)
    draws = [synth_sample(rng, size=16, n_labels=6) for _ in range(4)]
    bg = [float((l == 0).mean()) for _, l in draws]
    assert len(set(round(b, 4) for b in bg)) == 4
