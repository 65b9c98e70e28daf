"""Dense tensors against torchvision v2: a 13-channel float32 image and its segmentation mask
(``fields(image=..., mask=...)``) through one draw. The mask's labels encode their source pixel
(``y * W + x``), so the crop and flip stoker drew can be read back from the delivered mask; the
image and the mask must then equal torchvision's ``resized_crop`` + ``hflip`` of the same box:
the image with antialiased bilinear resampling in float (within float32 rounding), the mask with
``InterpolationMode.NEAREST`` (exactly, as a ``tv_tensors.Mask``).
"""

from __future__ import annotations

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")
tv2 = pytest.importorskip("torchvision.transforms.v2")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
F = tv2.functional
from torchvision.transforms import InterpolationMode  # noqa: E402

N, C, S, OUT = 12, 13, 64, 32


def bands(i: int) -> np.ndarray:
    """A smooth, textured 13-band float32 image in [0, 1], channels first."""
    y, x = np.mgrid[0:S, 0:S].astype(np.float64)
    rng = np.random.default_rng(i)
    planes = [
        0.5 + 0.4 * np.sin(x / (3 + c) + i) * np.cos(y / (4 + c % 5)) + rng.normal(0, 0.03, (S, S))
        for c in range(C)
    ]
    return np.stack(planes).astype(np.float32)


COORDS = (np.arange(S)[:, None] * S + np.arange(S)[None, :]).astype(np.int64)


class Scenes:
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"image": bands(i), "mask": COORDS}


SPEC = f"fields(image=image, mask=mask) | random_resized_crop({OUT}) | hflip"


def batches(**options):
    loader = stoker.Loader(
        Scenes(), batch_size=4, shuffle=True, seed=5, transform=SPEC, input_layout="chw", **options
    )
    out = [(np.array(b["image"]), np.array(b["mask"])) for b in loader]
    loader.close()
    return out


def draw_from_mask(mask: np.ndarray):
    """The candidate boxes ``(top, left, h, w, flip)`` whose nearest resample of the coordinate
    labels is ``mask`` exactly (nearest sampling can leave a box's size ambiguous by a pixel)."""
    flip = mask[0, 0] % S > mask[0, -1] % S
    unflipped = mask[:, ::-1] if flip else mask
    top, left = unflipped[0, 0] // S, unflipped[0, 0] % S
    coords = tv_tensors.Mask(torch.from_numpy(COORDS)[None])
    found = []
    for h in range(1, S - top + 1):
        for w in range(1, S - left + 1):
            m = F.resized_crop(coords, int(top), int(left), h, w, [OUT, OUT],
                               interpolation=InterpolationMode.NEAREST)
            if torch.equal(m[0], torch.from_numpy(np.ascontiguousarray(unflipped))):
                found.append((int(top), int(left), h, w, bool(flip)))
    return found


def test_image_and_mask_match_torchvision_on_the_same_draw():
    matched = 0
    for images, masks in batches():
        assert images.shape == (4, C, OUT, OUT) and images.dtype == np.float32
        assert masks.shape == (4, OUT, OUT) and masks.dtype == np.int64
        for image, mask in zip(images, masks):
            candidates = draw_from_mask(mask)
            assert candidates, "the mask is torchvision's nearest resized_crop of some box"
            # Which sample this is: the image's values identify it.
            errors = []
            for i in range(N):
                src = torch.from_numpy(bands(i))
                for top, left, h, w, flip in candidates:
                    ref = F.resized_crop(src, top, left, h, w, [OUT, OUT],
                                         interpolation=InterpolationMode.BILINEAR, antialias=True)
                    if flip:
                        ref = F.horizontal_flip(ref)
                    errors.append(float(np.abs(ref.numpy() - image).max()))
            assert min(errors) < 2e-5, min(errors)
            matched += 1
    assert matched == N


def test_the_mask_keeps_its_labels_and_batches_do_not_depend_on_workers():
    zero = batches(num_workers=0)
    three = batches(num_workers=3)
    assert len(zero) == len(three) == N // 4
    for (i0, m0), (i3, m3) in zip(zero, three):
        np.testing.assert_array_equal(i0, i3)
        np.testing.assert_array_equal(m0, m3)
        assert np.isin(m0, COORDS).all()


def test_a_colour_op_on_a_13_channel_image_is_refused_at_creation():
    with pytest.raises(stoker.InvalidArgumentError, match="13-channel float32"):
        stoker.Loader(Scenes(), batch_size=4, transform="color_jitter(brightness=0.2)",
                      input_layout="chw")
