"""dpbert: differentially private BERT pre-training on clinical text, as a TFX pipeline.

`pip install .` declares the real dependencies; for a reproducible environment install the lock
instead (`pip install --no-deps -r requirements/lock-py310.txt && pip install --no-deps -e .`),
which is what `make` does.
"""
from setuptools import find_packages, setup

setup(
    name="dpbert",
    version="0.1.0",
    description=(
        "TFX pipeline that pre-trains BERT on clinical notes with differential privacy "
        "(DP vocabulary + DP-SGD) and audits what the model kept"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9,<3.11",
    packages=find_packages(
        include=[
            "dpbert", "dpbert.*",
            "beam_jobs", "beam_jobs.*",
            "components", "components.*",
            "pipeline", "pipeline.*",
            "kubeflow", "kubeflow.*",
            "dashboard", "dashboard.*",
            "dpbert_cli", "dpbert_cli.*",
        ]
    ),
    package_data={"dpbert.data": ["lexicons/*.txt", "lexicons/README.md"],
                  "dpbert": ["configs/*.yaml", "resources/**/*"],
                  "dashboard": ["templates/*.html", "static/*"]},
    include_package_data=True,
    install_requires=[
        "tfx==1.16.*",
        "apache-beam[gcp]>=2.59,<2.60",
        "tensorflow>=2.16,<2.17",
        "tf-keras>=2.16,<2.17",
        "tensorflow-privacy==0.9.0",
        "dp-accounting==0.4.3",
        "tokenizers>=0.19",
        "numpy>=1.24,<2",
        "scipy>=1.10",
        "pyyaml>=6",
        "tqdm>=4.60",
        "safetensors>=0.4",
        "matplotlib>=3.7",
    ],
    extras_require={
        "kubeflow": ["kfp>=2.5,<2.6", "kfp-pipeline-spec==0.2.2"],
        "dashboard": ["starlette>=0.37", "uvicorn>=0.30", "jinja2>=3.1"],
        "test": ["pytest>=7", "pytest-timeout", "python-dp==1.1.5rc4", "httpx"],
    },
    entry_points={"console_scripts": ["dpbert=dpbert_cli.main:main"]},
)
