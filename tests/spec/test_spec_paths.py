"""Relative paths in a spec file resolve beside the file (dualtrain.spec.paths), whatever the
working directory; the weight map beside model.path first; paths not found there stay as written
(the working directory's), and --set paths are the command line's."""

import yaml

from dualtrain.spec.load import load_spec


def _write(folder, spec):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_paths_beside_the_spec_file_become_absolute(tmp_path, monkeypatch):
    cfg = tmp_path / "project" / "configs"
    (cfg / "ports").mkdir(parents=True)
    (cfg / "ports" / "map.yaml").write_text("[]\n")
    (cfg / "table.npz").write_bytes(b"")
    spec = {
        "data": {"dataset": "arrays", "path": "table.npz"},
        "model": {
            "inputs": [{"name": "x", "shape": [4]}],
            "torch": "m:f",
            "keras": "m:g",
            "path": "ports",
            "weight_map": "map.yaml",  # beside model.path, the pair's own files
        },
    }
    path = _write(cfg, spec)
    monkeypatch.chdir(tmp_path)  # anywhere but beside the spec
    s = load_spec(path)
    assert s.data.path == str(cfg / "table.npz")
    assert s.model.path == str(cfg / "ports")
    assert s.model.weight_map == str(cfg / "ports" / "map.yaml")


def test_paths_not_beside_the_spec_stay_as_written(tmp_path, monkeypatch):
    path = _write(tmp_path / "configs", {"data": {"dataset": "arrays", "path": "runs/d.npz"}})
    monkeypatch.chdir(tmp_path)
    assert load_spec(path).data.path == "runs/d.npz"  # the working directory's, as before
    # a --set path is the command line's, even where the spec's folder has one of that name
    (tmp_path / "configs" / "other.npz").write_bytes(b"")
    assert load_spec(path, ["data.path=other.npz"]).data.path == "other.npz"
