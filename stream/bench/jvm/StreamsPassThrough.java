// A Kafka Streams pass-through: the topology stream(input).to(output), at-least-once or exactly_once_v2, one
// stream thread (the machine has two cores, one for the broker). Prints {"events", "first_ts", "last_ts"} like
// the other contenders; last_ts after close(), which commits the final positions.
import java.nio.file.Files;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

public final class StreamsPassThrough {
    private StreamsPassThrough() {}

    public static void main(String[] args) throws Exception {
        Map<String, String> o = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) o.put(args[i].substring(2), args[i + 1]);
        for (String required : List.of("bootstrap", "input", "output", "group", "events", "guarantee")) {
            if (!o.containsKey(required)) throw new IllegalArgumentException("missing --" + required);
        }
        long events = Long.parseLong(o.get("events"));
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, o.get("group"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, o.get("bootstrap"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, switch (o.get("guarantee")) {
            case "at-least-once" -> StreamsConfig.AT_LEAST_ONCE;
            case "exactly-once" -> StreamsConfig.EXACTLY_ONCE_V2;
            default -> throw new IllegalArgumentException("--guarantee at-least-once or exactly-once");
        });
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        p.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("streams-bench-").toString());
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_RECORDS_CONFIG), "10000");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), "5");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG), "lz4");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), "262144");
        AtomicLong seen = new AtomicLong();
        AtomicLong firstMs = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(o.get("input"), Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .peek((k, v) -> {
                firstMs.compareAndSet(0, System.currentTimeMillis());
                if (seen.incrementAndGet() >= events) done.countDown();
            })
            .to(o.get("output"), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        KafkaStreams streams = new KafkaStreams(builder.build(), p);
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            done.countDown();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                .SHUTDOWN_CLIENT;
        });
        streams.start();
        if (!done.await(3600, TimeUnit.SECONDS)) throw new IllegalStateException("no end within an hour");
        streams.close();
        double last = System.currentTimeMillis() / 1000.0;
        if (seen.get() < events) throw new IllegalStateException("stopped after " + seen.get() + " records");
        System.out.printf("{\"events\": %d, \"first_ts\": %.3f, \"last_ts\": %.3f}%n", seen.get(),
                          firstMs.get() / 1000.0, last);
    }
}
