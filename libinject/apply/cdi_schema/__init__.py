"""The CDI JSON schema (cncf-tags/container-device-interface @05ae4b5, spec 1.1.0),
shipped with the package so `nvhook cdi validate` needs nothing outside it.
tests/test_cdi.py checks these files equal the upstream CDI schema."""
