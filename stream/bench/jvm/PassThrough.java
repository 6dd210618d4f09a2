// A JVM kafka-clients pass-through, the benchmark's limit for "consume, produce the same bytes, commit":
//   flush      poll -> send every record -> producer.flush() -> commitAsync of the polled positions
//   pipelined  poll -> send with a callback; offsets are committed (commitAsync, every 100 ms) up to the first
//              record of each input partition whose send is not acknowledged yet; no flush per poll
// Prints one JSON line like the Python contenders: {"events": n, "first_ts": s, "last_ts": s} (Unix seconds;
// last_ts after the final synchronous commit).
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class PassThrough {
    private PassThrough() {}

    static Map<String, String> options(String[] args) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) throw new IllegalArgumentException("expected --name value, got " + args[i]);
            out.put(args[i].substring(2), args[i + 1]);
        }
        for (String required : List.of("bootstrap", "input", "output", "group", "events", "mode")) {
            if (!out.containsKey(required)) throw new IllegalArgumentException("missing --" + required);
        }
        return out;
    }

    static Properties consumerProps(Map<String, String> o) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, o.get("bootstrap"));
        p.put(ConsumerConfig.GROUP_ID_CONFIG, o.get("group"));
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "10000");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return p;
    }

    static Properties producerProps(Map<String, String> o) {
        // As the worker's producer: idempotent, acks=all, lz4, 5 ms linger.
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, o.get("bootstrap"));
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "262144");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return p;
    }

    /** Per input partition: offsets sent in order, and those acknowledged; the committable position. */
    static final class Pending {
        final ArrayDeque<Long> sent = new ArrayDeque<>();
        final java.util.Set<Long> acked = ConcurrentHashMap.newKeySet();
        long position = -1;

        long advance() {
            while (!sent.isEmpty() && acked.remove(sent.peekFirst())) {
                position = sent.pollFirst() + 1;
            }
            return position;
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = options(args);
        long events = Long.parseLong(o.get("events"));
        boolean pipelined = switch (o.get("mode")) {
            case "flush" -> false;
            case "pipelined" -> true;
            default -> throw new IllegalArgumentException("--mode flush or pipelined, not " + o.get("mode"));
        };
        String output = o.get("output");
        AtomicReference<Exception> failed = new AtomicReference<>();
        Map<TopicPartition, Pending> pending = new HashMap<>();
        Map<TopicPartition, OffsetAndMetadata> positions = new HashMap<>();
        long n = 0;
        double first = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps(o));
             KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps(o))) {
            consumer.subscribe(List.of(o.get("input")));
            long nextCommit = System.nanoTime();
            while (n < events) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    if (first == 0) first = System.currentTimeMillis() / 1000.0;
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    ProducerRecord<byte[], byte[]> out = new ProducerRecord<>(output, r.key(), r.value());
                    if (pipelined) {
                        Pending p = pending.computeIfAbsent(tp, k -> new Pending());
                        long offset = r.offset();
                        p.sent.addLast(offset);
                        producer.send(out, (meta, error) -> {
                            if (error != null) failed.compareAndSet(null, error);
                            else p.acked.add(offset);
                        });
                    } else {
                        producer.send(out, (meta, error) -> {
                            if (error != null) failed.compareAndSet(null, error);
                        });
                        positions.put(tp, new OffsetAndMetadata(r.offset() + 1));
                    }
                    n++;
                }
                if (failed.get() != null) throw failed.get();
                if (pipelined) {
                    if (System.nanoTime() >= nextCommit) {
                        for (Map.Entry<TopicPartition, Pending> e : pending.entrySet()) {
                            long position = e.getValue().advance();
                            if (position >= 0) positions.put(e.getKey(), new OffsetAndMetadata(position));
                        }
                        if (!positions.isEmpty()) consumer.commitAsync(new HashMap<>(positions), null);
                        nextCommit = System.nanoTime() + 100_000_000L;
                    }
                } else if (!records.isEmpty()) {
                    producer.flush();
                    if (failed.get() != null) throw failed.get();
                    consumer.commitAsync(new HashMap<>(positions), null);
                }
            }
            producer.flush();
            if (failed.get() != null) throw failed.get();
            if (pipelined) {
                for (Map.Entry<TopicPartition, Pending> e : pending.entrySet()) {
                    long position = e.getValue().advance();
                    if (position >= 0) positions.put(e.getKey(), new OffsetAndMetadata(position));
                }
            }
            consumer.commitSync(positions);
            double last = System.currentTimeMillis() / 1000.0;
            System.out.printf("{\"events\": %d, \"first_ts\": %.3f, \"last_ts\": %.3f}%n", n, first, last);
        }
    }
}
