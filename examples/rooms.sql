-- Overheating thresholds per room for examples/iot-thresholds.cep (docs/databases.md).
-- Portable SQL: load it into SQLite or PostgreSQL. site2/room5 has no row, so its
-- readings never count as overheating (a missing row makes the condition false).
CREATE TABLE rooms (room TEXT PRIMARY KEY, threshold DOUBLE PRECISION, floor INTEGER);
INSERT INTO rooms VALUES
    ('site1/room1', 30.0, 1), ('site1/room2', 35.0, 1), ('site1/room3', 40.0, 2),
    ('site1/room4', 33.5, 2), ('site1/room5', 37.0, 3), ('site2/room1', 35.0, 1),
    ('site2/room2', 31.0, 1), ('site2/room3', 36.0, 2), ('site2/room4', NULL, 2);
