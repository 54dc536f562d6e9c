"""The pair-description cache's key (dualtrain.driver.pair_cache): what changes the descriptions
changes the key (the model section, the seed, the factories' folder's sources), what does not
leaves it (training settings); off with DUALTRAIN_PAIR_CACHE=0; an entry is whole or absent."""

import pytest

from dualtrain.driver import pair_cache
from dualtrain.spec.load import from_dict


@pytest.fixture
def pair_dir(tmp_path, monkeypatch):
    folder = tmp_path / "ports"
    folder.mkdir()
    (folder / "tmod.py").write_text("def net(width=8):\n    return width\n")
    (folder / "kmod.py").write_text("def net(width=8):\n    return width\n")
    (folder / "helper.py").write_text("X = 1\n")
    monkeypatch.setenv(pair_cache.OFF_ENV, str(tmp_path / "cache"))
    return folder


def _spec(folder, *, seed=0, width=8, epochs=1, torch="tmod:net"):
    return from_dict(
        {
            "seed": seed,
            "model": {
                "inputs": [{"name": "x", "shape": [4]}],
                "torch": torch,
                "keras": "kmod:net",
                "path": str(folder),
                "args": {"width": width},
            },
            "train": {"epochs": epochs},
        }
    )


def test_what_changes_the_descriptions_changes_the_key(pair_dir):
    base = pair_cache.key(_spec(pair_dir))
    assert base is not None and base == pair_cache.key(_spec(pair_dir, epochs=5))
    assert pair_cache.key(_spec(pair_dir, seed=1)) != base
    assert pair_cache.key(_spec(pair_dir, width=16)) != base
    (pair_dir / "helper.py").write_text("X = 2\n")  # a neighbour the factory may import
    assert pair_cache.key(_spec(pair_dir)) != base


def test_off_and_unpinnable_factories_are_not_cached(pair_dir, monkeypatch):
    assert pair_cache.key(_spec(pair_dir, torch="no_such_module_anywhere:net")) is None
    monkeypatch.setenv(pair_cache.OFF_ENV, "0")
    assert pair_cache.key(_spec(pair_dir)) is None


def test_an_entry_is_whole_or_absent(pair_dir, tmp_path):
    spec = _spec(pair_dir)
    k = pair_cache.key(spec)
    made = tmp_path / "made"
    for f in pair_cache.FILES:
        (made / f).parent.mkdir(parents=True, exist_ok=True)
        (made / f).write_text(f)
    assert not pair_cache.fetch(k, tmp_path / "a", spec)
    pair_cache.store(k, made, spec)
    assert pair_cache.fetch(k, tmp_path / "b", spec)
    assert all((tmp_path / "b" / f).read_text() == f for f in pair_cache.FILES)
    (tmp_path / "cache" / k / pair_cache.FILES[-1]).unlink()  # a broken entry is no entry
    assert not pair_cache.fetch(k, tmp_path / "c", spec)


def test_a_converted_pairs_entry_holds_its_learned_map(pair_dir, tmp_path):
    spec = from_dict(
        {
            "model": {
                "torch": "tmod:net",
                "convert": "kmod:net",
                "path": str(pair_dir),
                "inputs": [{"name": "x", "shape": [4]}],
            }
        }
    )
    k = pair_cache.key(spec)
    assert k is not None and k != pair_cache.key(_spec(pair_dir))
    made = tmp_path / "made"
    for f in pair_cache.FILES:  # the learned map missing: nothing is stored
        (made / f).parent.mkdir(parents=True, exist_ok=True)
        (made / f).write_text(f)
    pair_cache.store(k, made, spec)
    assert not pair_cache.fetch(k, tmp_path / "a", spec)
    (made / "torch" / "converted.json").write_text("{}")
    pair_cache.store(k, made, spec)
    assert pair_cache.fetch(k, tmp_path / "b", spec)
    assert (tmp_path / "b" / "torch" / "converted.json").read_text() == "{}"
