"""Maps the top-level folders onto one import namespace, `miserver`.

impl/ -> miserver, generated/ -> miserver.generated, conformance/ ->
miserver.conformance, spec/ -> miserver.spec (data only). Everything else
lives in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = {
    "miserver": "impl",
    "miserver.generated": "generated",
    "miserver.conformance": "conformance",
    "miserver.spec": "spec",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    for sub in find_packages(folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "miserver.spec": ["**/*.yaml", "**/*.json", "**/*.abnf", "**/*.md"],
        "miserver.models": ["catalog.json"],
        "miserver.web": ["*.html", "*.js", "*.css"],
    },
)
