-- A registry as schema version 1 (the first release) wrote it, for the migration test.
BEGIN;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
    CREATE TABLE blobs (hash TEXT PRIMARY KEY, bytes BLOB NOT NULL) STRICT;
    CREATE TABLE tools (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        version TEXT NOT NULL,
        kind TEXT NOT NULL,
        description TEXT NOT NULL,
        manifest TEXT NOT NULL,
        blob_hash TEXT REFERENCES blobs(hash),
        embedding BLOB,
        usage_count INTEGER NOT NULL DEFAULT 0,
        success_count INTEGER NOT NULL DEFAULT 0,
        failure_count INTEGER NOT NULL DEFAULT 0,
        reward_sum REAL NOT NULL DEFAULT 0,
        reward_count INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        author TEXT,
        run TEXT,
        parents TEXT NOT NULL DEFAULT '[]'
    ) STRICT;
    CREATE TABLE edges (
        src INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE,
        dst INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE,
        count INTEGER NOT NULL,
        weight REAL NOT NULL,
        PRIMARY KEY (src, dst)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX edges_dst ON edges(dst);
    CREATE TABLE aliases (
        alias TEXT PRIMARY KEY,
        canonical INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE
    ) STRICT;
    CREATE TABLE candidates (
        id INTEGER PRIMARY KEY,
        run TEXT NOT NULL,
        iteration INTEGER NOT NULL,
        task TEXT NOT NULL,
        trajectory TEXT NOT NULL,
        reward REAL NOT NULL,
        manifest TEXT NOT NULL,
        blob_hash TEXT REFERENCES blobs(hash),
        created_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX candidates_iteration ON candidates(run, iteration);
INSERT INTO blobs VALUES ('af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262', X'');
INSERT INTO tools (id, name, version, kind, description, manifest, blob_hash, embedding, usage_count, success_count, failure_count, reward_sum, reward_count, created_at, author, run, parents) VALUES (1, 'celsius_to_fahrenheit', '0.1.0', 'plugin', 'Convert a temperature from degrees Celsius to degrees Fahrenheit.', '{"name": "celsius_to_fahrenheit", "version": "0.1.0", "description": "Convert a temperature from degrees Celsius to degrees Fahrenheit.", "input_schema": {"type": "object", "properties": {"celsius": {"type": "number", "description": "temperature in Celsius"}}}, "output_schema": {"type": "object"}, "kind": "plugin"}', 'af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262', NULL, 3, 2, 1, 1.5, 1, 1700000000000, 'fixture', NULL, '[]');
INSERT INTO tools (id, name, version, kind, description, manifest, blob_hash, embedding, usage_count, success_count, failure_count, reward_sum, reward_count, created_at, author, run, parents) VALUES (2, 'word_count', '0.1.0', 'python', 'Count the words in a text.', '{"name": "word_count", "version": "0.1.0", "description": "Count the words in a text.", "input_schema": {"type": "object", "properties": {"text": {"type": "string", "description": "the text"}}}, "output_schema": {"type": "object"}, "kind": "python"}', NULL, NULL, 6, 4, 2, 3.0, 2, 1700000000000, 'fixture', NULL, '[]');
INSERT INTO tools (id, name, version, kind, description, manifest, blob_hash, embedding, usage_count, success_count, failure_count, reward_sum, reward_count, created_at, author, run, parents) VALUES (3, 'mean', '0.1.0', 'python', 'Arithmetic mean of a list of numbers.', '{"name": "mean", "version": "0.1.0", "description": "Arithmetic mean of a list of numbers.", "input_schema": {"type": "object", "properties": {"values": {"type": "array", "description": "numbers"}}}, "output_schema": {"type": "object"}, "kind": "python"}', NULL, NULL, 9, 6, 3, 4.5, 3, 1700000000000, 'fixture', NULL, '[]');
INSERT INTO edges VALUES (3, 2, 4, 4.0);
INSERT INTO edges VALUES (2, 1, 1, 0.5);
INSERT INTO aliases VALUES ('average', 3);
INSERT INTO candidates (run, iteration, task, trajectory, reward, manifest, blob_hash, created_at) VALUES ('run-1', 0, 'task-a', 't0', 0.75, '{"name": "median", "version": "0.1.0", "description": "Median of a list of numbers.", "input_schema": {"type": "object", "properties": {"values": {"type": "array"}}}, "output_schema": {"type": "object"}, "kind": "python"}', NULL, 1700000000001);
PRAGMA user_version = 1;
PRAGMA application_id = 1414745426;
COMMIT;
