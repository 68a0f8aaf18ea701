"""The schema version written into every manifest. Bump the major part on breaking changes."""

SCHEMA_VERSION = "1.0"
