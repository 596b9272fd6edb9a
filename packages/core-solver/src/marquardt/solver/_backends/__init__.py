"""Array backends for the LM linear algebra: the protocol (``base``) and its implementations."""
