/*
 * Generic protobuf-c message -> JSON (jansson) through the message
 * descriptors, for /config_dump and the controller's views of snapshots.
 * Field names as in the .proto (snake_case); enums as their names; 64-bit
 * integers as JSON integers.
 */
#ifndef SL_PBJSON_H
#define SL_PBJSON_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

json_t *sl_pbjson_from_message(const ProtobufCMessage *msg);

#endif
