"""The optional compiled decoder, ``segmenter._fastwire`` (everything else is in pyproject.toml).

Built when a C compiler and the Python headers are there (the broker extra's python-qpid-proton
needs them too); without them the build warns and goes on, and ``segmenter.wire`` decodes in
Python, with the same results (``optional``: a failed compile is not a failed install).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "segmenter._fastwire",
            ["segmenter/_fastwire.c"],
            depends=["segmenter/_fastwire_table.h"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
