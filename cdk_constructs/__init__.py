"""CDK constructs, one logical unit each.

The package is not called ``constructs`` because aws-cdk-lib imports the ``constructs`` library
by that name: a local package of the same name would shadow it and break every import.
"""
