"""Build hook (all metadata is in pyproject.toml): a wheel carries the committed small LM.

``data/pretrained/small_lm`` (2 MB: the model, its tokenizer and the metadata that pins its build) is copied into
the built package as ``taskloss/lm/small_lm``, so that ``pip install <clone>`` (not editable) gives a package whose
``taskloss.lm.load_pretrained_lm()`` works outside the clone. An editable install reads the clone's ``data/``.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SMALL_LM = Path(__file__).resolve().parent / "data" / "pretrained" / "small_lm"
FILES = ("model.pt", "tokenizer.json", "meta.json")


class BuildWithSmallLM(build_py):
    """``build_py`` plus the small LM's three files under ``taskloss/lm/small_lm``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        missing = [n for n in FILES if not (SMALL_LM / n).is_file()]
        if missing:
            raise SystemExit(f"{SMALL_LM} lacks {missing}: run `make pretrained` before building a wheel")
        target = Path(self.build_lib) / "taskloss" / "lm" / "small_lm"
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(SMALL_LM / name, target / name)


setup(cmdclass={"build_py": BuildWithSmallLM})
